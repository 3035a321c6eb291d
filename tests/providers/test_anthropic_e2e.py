"""The anthropic provider end to end through a real qcluster, against a
local server that speaks the Messages protocol: an overload (529) retried
before output, parallel tool use, a stream cut after output left to the
loop, and streamed text batched into delta events; the key goes only to the
operator-configured endpoint and nowhere else."""

from __future__ import annotations

import json

import pytest

from runs.models import Event, ModelCall, Run, ToolInvocation
from tests.conftest import wait_for
from tests.providers.fake_anthropic import (
    FakeAnthropic,
    answer,
    error_body,
    events,
    message_start,
    text_answer,
    text_delta,
    text_start,
    tool_answer,
)
from tests.providers.test_openai_e2e import database_text

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

KEY = "sk-ant-e2e-SECRET-3c0ffee1"
PRICES = {"claude-test": {"input_per_mtok": 3.0, "output_per_mtok": 15.0, "cache_read_per_mtok": 0.3}}


@pytest.fixture
def fake():
    server = FakeAnthropic().start()
    yield server
    server.close()


def endpoints(fake) -> dict:
    return {"claude": {"provider": "anthropic", "base_url": fake.base_url, "api_key_env": "AGENTRT_TEST_ANTHROPIC_KEY"}}


def status(run):
    return Run.objects.filter(id=run.id).values_list("status", flat=True).get()


def test_a_run_on_the_anthropic_provider_through_a_real_cluster(load_agent, submit, fake, settings, cluster):
    settings.AGENTRT_MODEL_PRICES = PRICES
    settings.AGENTRT_MODEL_ENDPOINTS = endpoints(fake)
    load_agent(
        name="claude-bot",
        model={"provider": "anthropic", "endpoint": "claude", "model": "claude-test", "max_tokens": 256},
        tools=("echo",),
    )
    fake.push(
        answer(529, error_body("overloaded_error", f"Overloaded, key {KEY}"), {"Retry-After": "0"}),
        tool_answer(("toolu_l", "echo", '{"text": "left"}'), ("toolu_r", "echo", '{"text": "right"}'), text="Both."),
        events(message_start(30), text_start(0), text_delta(0, "I will "), text_delta(0, "say"), cut_after=4),
        text_answer(*[f"word{i} " for i in range(8)], input_tokens=60, output_tokens=16, delay=0.1),
    )
    c = cluster(
        AGENTRT_MODEL_PRICES=json.dumps(PRICES),
        AGENTRT_MODEL_ENDPOINTS=json.dumps(endpoints(fake)),
        AGENTRT_TEST_ANTHROPIC_KEY=KEY,
        AGENTRT_LEASE_SECONDS=5,
        AGENTRT_LOG_LEVEL="DEBUG",
    )
    run = submit(agent="claude-bot", text="say both")
    wait_for(lambda: status(run) in ("COMPLETED", "FAILED"), timeout=90, message="the run to end")
    row = Run.objects.get(id=run.id)
    assert row.status == "COMPLETED", row.failure
    assert row.final_message.startswith("word0 word1")
    assert len(fake.requests) == 4  # the 529 retried by the provider before any output; the cut retried by the loop
    assert all(r["path"] == "/v1/messages" for r in fake.requests)
    assert all(r["headers"]["x-api-key"] == KEY and "authorization" not in r["headers"] for r in fake.requests)
    # Parallel tool use ran both calls; their results went back as one user message of tool_result blocks.
    parallel = list(
        ToolInvocation.objects.filter(run=run, step_number=1).order_by("call_index").values_list("status", "result")
    )
    assert parallel == [("completed", "left"), ("completed", "right")]
    results = fake.requests[2]["body"]["messages"][-1]
    assert results["role"] == "user"
    assert [(b["type"], b["tool_use_id"]) for b in results["content"]] == [
        ("tool_result", "toolu_l"),
        ("tool_result", "toolu_r"),
    ]
    calls = list(
        ModelCall.objects.filter(run=run)
        .order_by("step_number", "attempt_number")
        .values_list("step_number", "attempt_number", "status", "stream_had_output")
    )
    assert calls == [(1, 1, "completed", False), (2, 1, "failed", True), (2, 2, "completed", False)]
    failed = Event.objects.get(run=run, type="model.response.failed").payload
    assert failed["error_class"] == "StreamCutAfterOutput"
    deltas = list(
        Event.objects.filter(run=run, type="model.response.delta", payload__step=2, payload__attempt=2)
        .order_by("sequence")
        .values_list("payload", flat=True)
    )
    assert 1 <= len(deltas) < 8 and "".join(d["text"] for d in deltas).startswith("word0")
    assert row.usage["cost_usd"] > 0 and row.usage["input_tokens"] >= 20 + 30 + 60
    everything = json.dumps(list(Event.objects.filter(run=run).values_list("payload", flat=True)))
    assert KEY not in everything and "Overloaded" not in everything
    log = c.output()
    assert log.strip() and KEY not in log, "the key reached the worker's log"
    assert KEY not in database_text()
