"""The openai provider end to end through a real qcluster, against a local
server that speaks the chat-completions protocol."""

from __future__ import annotations

import json

import pytest

from runs.models import Event, ModelCall, Run, ToolInvocation
from tests.conftest import wait_for
from tests.providers.conftest import KEY, PRICES, endpoints_for
from tests.providers.fake_openai import answer, chunk, stream, text_stream, tool_delta, usage_chunk

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def agent(load_agent, fake, settings, **extra):
    settings.AGENTRT_MODEL_ENDPOINTS = endpoints_for(fake)
    return load_agent(
        name="gpt-bot",
        model={"provider": "openai", "endpoint": "test", "model": "test-model"},
        tools=("echo",),
        **extra,
    )


def status(run):
    return Run.objects.filter(id=run.id).values_list("status", flat=True).get()


def test_retries_malformed_arguments_cut_stream_empty_turn_and_streamed_deltas(
    load_agent, submit, fake, settings, cluster
):
    settings.AGENTRT_MODEL_PRICES = PRICES
    agent(load_agent, fake, settings)
    fake.push(
        answer(429, {"error": {"message": "slow down, key sk-leaked-1234567890abcdef"}}, {"Retry-After": "0"}),
        stream(
            [
                chunk("", role="assistant"),
                chunk(tool_calls=[tool_delta(0, id="c1", name="echo", arguments='{"text": ')]),
                chunk(tool_calls=[tool_delta(0, arguments="oops")]),
                chunk(finish="tool_calls"),
                usage_chunk(40, 8),
            ]
        ),
        answer(500, {"error": {"message": "internal"}}),
        stream(
            [
                chunk("", role="assistant"),
                chunk(
                    tool_calls=[
                        tool_delta(0, id="p1", name="echo", arguments='{"text": "left"}'),
                        tool_delta(1, id="p2", name="echo", arguments='{"text": "right"}'),
                    ]
                ),
                chunk(finish="tool_calls"),
                usage_chunk(45, 9),
            ]
        ),
        stream([chunk("", role="assistant"), chunk("I will "), chunk("say")], cut_after=3, done=False),
        text_stream(finish="stop", usage=(50, 0)),
        text_stream(*[f"word{i} " for i in range(8)], usage=(60, 16), delay=0.1),
    )
    c = cluster(
        AGENTRT_MODEL_PRICES=json.dumps(PRICES),
        AGENTRT_MODEL_ENDPOINTS=json.dumps(endpoints_for(fake)),
        AGENTRT_TEST_OPENAI_KEY=KEY,
        AGENTRT_LEASE_SECONDS=5,
        AGENTRT_LOG_LEVEL="DEBUG",
    )
    run = submit(agent="gpt-bot", text="hi")
    wait_for(lambda: status(run) in ("COMPLETED", "FAILED"), timeout=60, message="the run to end")
    row = Run.objects.get(id=run.id)
    assert row.status == "COMPLETED", row.failure
    assert row.final_message.startswith("word0 word1")
    assert len(fake.requests) == 7  # 429 and 500 retried by the provider before any output
    assert all(r["headers"]["authorization"] == f"Bearer {KEY}" for r in fake.requests)
    # The malformed arguments became a tool result the model saw on the next request.
    bad = ToolInvocation.objects.get(run=run, step_number=1)
    assert bad.status == "failed" and bad.result["error"] == "invalid_arguments"
    second = fake.requests[2]["body"]["messages"]
    assert any(m.get("role") == "tool" and "invalid_arguments" in m.get("content", "") for m in second)
    # Parallel tool calls of one turn both ran.
    parallel = list(
        ToolInvocation.objects.filter(run=run, step_number=2).order_by("call_index").values_list("status", "result")
    )
    assert parallel == [("completed", "left"), ("completed", "right")]
    calls = list(
        ModelCall.objects.filter(run=run)
        .order_by("step_number", "attempt_number")
        .values_list("step_number", "attempt_number", "status", "stream_had_output")
    )
    assert calls == [
        (1, 1, "completed", False),
        (2, 1, "completed", False),
        (3, 1, "failed", True),
        (3, 2, "failed", False),
        (3, 3, "completed", False),
    ]
    failed = list(Event.objects.filter(run=run, type="model.response.failed").values_list("payload", flat=True))
    assert [f["error_class"] for f in failed] == ["StreamCutAfterOutput", "EmptyModelTurn"]
    deltas = list(
        Event.objects.filter(run=run, type="model.response.delta", payload__step=3, payload__attempt=3)
        .order_by("sequence")
        .values_list("payload", flat=True)
    )
    assert 1 <= len(deltas) < 8  # batched, not one row per token
    assert "".join(d["text"] for d in deltas).startswith("word0")
    assert row.usage["input_tokens"] >= 150 and row.usage["cost_usd"] > 0
    everything = json.dumps(list(Event.objects.filter(run=run).values_list("payload", flat=True))) + json.dumps(
        row.failure
    )
    assert KEY not in everything and "sk-leaked" not in everything and "slow down" not in everything
    # No secret in the log nor anywhere in the database: this cluster held the key (every request carried it, above)
    # and saw an error body quoting another one, and it logged at DEBUG.
    log = c.output()
    assert log.strip(), "the worker logged nothing to search"
    assert KEY not in log and "sk-leaked" not in log, "a secret reached the worker's log"
    db = database_text()
    assert KEY not in db and "sk-leaked" not in db, "a secret reached the database"


def database_text() -> str:
    """Every row of every table of the test database, as text."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        tables = [t for (t,) in cur.fetchall()]
        out = []
        for t in tables:
            cur.execute(f'SELECT t::text FROM "{t}" t')
            out.extend(r for (r,) in cur.fetchall())
    return "\n".join(out)


def test_a_missing_api_key_fails_the_run_before_any_request(load_agent, submit, fake, settings, cluster):
    settings.AGENTRT_MODEL_PRICES = PRICES
    agent(load_agent, fake, settings)
    cluster(
        AGENTRT_MODEL_PRICES=json.dumps(PRICES),
        AGENTRT_MODEL_ENDPOINTS=json.dumps(endpoints_for(fake)),
        AGENTRT_LEASE_SECONDS=5,
    )
    run = submit(agent="gpt-bot", text="hi")
    wait_for(lambda: status(run) == "FAILED", timeout=60, message="the run to fail")
    row = Run.objects.get(id=run.id)
    assert row.failure["reason"] == "model_permanent_error" and row.failure["error_class"] == "MissingApiKey"
    assert "AGENTRT_TEST_OPENAI_KEY" not in json.dumps(row.failure)  # the tenant is not told which variable
    assert fake.requests == []  # (the secret-in-the-log check is in the test above, where the cluster holds the key)


def test_an_unpriced_model_is_refused_when_the_agent_is_loaded(load_agent, fake, settings):
    from runs.errors import InvalidInput

    settings.AGENTRT_MODEL_PRICES = {}
    with pytest.raises(InvalidInput) as exc:
        agent(load_agent, fake, settings)
    assert "no price" in exc.value.message
