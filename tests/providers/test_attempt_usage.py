"""A cut stream was paid for (issue 11 item 8): the openai adapter reports
what a failed attempt spent — the usage the server sent before the cut, else
a conservative estimate — and the loop charges it, so a run whose attempts
keep failing after output stops at `max_cost_usd`. Against the local server
that speaks chat completions (tests/providers/fake_openai.py)."""

from __future__ import annotations

import math

import pytest

from runs.domain.cancellation import Token
from runs.domain.errors import ModelError
from runs.models import ModelCall, Run
from runs.runtime.executor import run_drive
from tests.providers.conftest import endpoints_for, make_request
from tests.providers.fake_openai import chunk, stream, usage_chunk

pytestmark = pytest.mark.django_db(transaction=True)


def cut_with_usage(prompt=10_000, completion=1_000):
    # Output, the usage chunk, then the connection drops before finish_reason and [DONE].
    return stream(
        [chunk("", role="assistant"), chunk("I will pay"), usage_chunk(prompt, completion)], cut_after=3, done=False
    )


def test_a_stream_cut_after_output_carries_the_usage_the_server_reported(make_provider, fake):
    fake.push(cut_with_usage())
    with pytest.raises(ModelError) as info:
        make_provider().complete(make_request(), Token())
    exc = info.value
    assert exc.error_class == "StreamCutAfterOutput" and exc.stream_had_output
    assert exc.usage is not None
    assert (exc.usage.input_tokens, exc.usage.output_tokens) == (10_000, 1_000)
    assert exc.usage.cost_usd == pytest.approx(10_000 * 2.0 / 1e6 + 1_000 * 8.0 / 1e6)


def test_a_stream_cut_after_output_without_usage_is_estimated_never_free(make_provider, fake):
    fake.push(stream([chunk("", role="assistant"), chunk("x" * 400)], cut_after=2, done=False))
    request = make_request(messages=[{"role": "user", "content": "y" * 4000}])
    with pytest.raises(ModelError) as info:
        make_provider().complete(request, Token())
    usage = info.value.usage
    assert usage is not None and usage.cost_usd > 0
    assert usage.input_tokens >= math.ceil(4000 / 4) and usage.output_tokens >= 100


def test_a_failure_before_any_output_is_not_charged(make_provider, fake):
    fake.push(stream([chunk("", role="assistant")], cut_after=1, done=False))
    with pytest.raises(ModelError) as info:
        make_provider(max_tries=1).complete(make_request(), Token())
    assert not info.value.stream_had_output and info.value.usage is None


def test_cut_streams_are_charged_and_the_run_stops_at_its_cost_limit(load_agent, submit, fake, priced, api_key):
    priced.AGENTRT_MODEL_ENDPOINTS = endpoints_for(fake)
    load_agent(
        name="gpt-bot",
        model={"provider": "openai", "endpoint": "test", "model": "test-model"},
        limits={"max_cost_usd": 0.05},
    )
    fake.push(cut_with_usage())  # every attempt: 0.028 USD, then cut
    run = submit(agent="gpt-bot")
    run_drive(run_id=run.id)
    row = Run.objects.get(id=run.id)
    assert row.status == "FAILED" and row.failure["reason"] == "budget_exceeded", (row.failure, row.usage)
    assert len(fake.requests) == 2  # the third attempt was never sent
    assert row.usage["cost_usd"] == pytest.approx(0.056)
    assert row.usage["input_tokens"] == 20_000 and row.usage["output_tokens"] == 2_000
    assert list(ModelCall.objects.filter(run=run).values_list("status", flat=True)) == ["failed", "failed"]
