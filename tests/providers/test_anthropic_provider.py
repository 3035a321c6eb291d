"""The `anthropic` adapter against a local server that speaks the Messages
protocol (tests/providers/fake_anthropic.py).

No database: the adapter is a plain object. Each test scripts the server's
answers, calls `complete()` once, and asserts on the turn, the error and the
requests the server received.
"""

from __future__ import annotations

import random
import threading

import pytest

from runs.domain.errors import ModelError
from runs.domain.values import CancelReason, StopReason
from runs.providers.anthropic import AnthropicProvider
from runs.providers.endpoints import Endpoint
from tests.providers.conftest import RecordingToken, make_request
from tests.providers.fake_anthropic import (
    MESSAGE_STOP,
    FakeAnthropic,
    answer,
    block_stop,
    error_body,
    events,
    json_delta,
    message_delta,
    message_start,
    text_answer,
    text_delta,
    text_start,
    tool_answer,
    tool_start,
)

KEY = "sk-ant-test-SECRET-9b1e44c2"
PRICES = {"claude-test": {"input_per_mtok": 3.0, "output_per_mtok": 15.0, "cache_read_per_mtok": 0.3}}
TOOLS = [
    {
        "name": "http_get",
        "description": "Fetch a URL",
        "parameters": {"type": "object", "properties": {"url": {"type": "string"}}},
    },
    {"name": "echo", "description": "", "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}},
]


@pytest.fixture
def fake():
    server = FakeAnthropic().start()
    yield server
    server.close()


@pytest.fixture
def make_provider(fake, settings, monkeypatch):
    settings.AGENTRT_MODEL_PRICES = PRICES
    monkeypatch.setenv("AGENTRT_TEST_ANTHROPIC_KEY", KEY)

    def make(**kwargs) -> AnthropicProvider:
        endpoint = Endpoint(
            name="claude", provider="anthropic", base_url=fake.base_url, api_key_env="AGENTRT_TEST_ANTHROPIC_KEY"
        )
        kwargs.setdefault("rng", random.Random(7))
        kwargs.setdefault("backoff_base", 0.01)
        return AnthropicProvider(endpoint, kwargs.pop("model", "claude-test"), **kwargs)

    return make


def assert_no_secret(exc: BaseException) -> None:
    for text in (str(exc), repr(exc), str(exc.args)):
        assert KEY not in text and "SECRET" not in text


# -- request translation and the text stream ------------------------------------


def test_text_stream_usage_with_cache_cost_headers_and_request_translation(fake, make_provider):
    fake.push(
        events(
            message_start(600, cache_read=300, cache_creation=100),
            text_start(0),
            text_delta(0, "Hel"),
            text_delta(0, "lo"),
            block_stop(0),
            message_delta("end_turn", 42),
            MESSAGE_STOP,
        )
    )
    deltas: list[str] = []
    conversation = [
        {"role": "user", "content": "fetch both"},
        {
            "role": "assistant",
            "content": "On it.",
            "tool_calls": [
                {"id": "toolu_a", "name": "http_get", "arguments": '{"url": "http://x"}'},
                {"id": "toolu_b", "name": "echo", "arguments": "not json"},
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "toolu_a",
            "name": "http_get",
            "content": '{"status": 200}',
            "is_error": False,
        },
        {"role": "tool", "tool_call_id": "toolu_b", "name": "echo", "content": '{"error": "x"}', "is_error": True},
        {"role": "system", "content": "Answer now."},
    ]
    turn = make_provider(on_delta=deltas.append, max_tokens=512).complete(
        make_request(conversation, tools=TOOLS), RecordingToken()
    )
    assert turn.text == "Hello" and deltas == ["Hel", "lo"] and turn.stop_reason is StopReason.END_TURN
    # Anthropic's input_tokens excludes the cache; ours includes it (prices.py's convention).
    usage = turn.usage
    assert (usage.input_tokens, usage.output_tokens) == (1000, 42)
    assert (usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (300, 100)
    assert usage.cost_usd == pytest.approx((600 * 3.0 + 300 * 0.3 + 100 * 3.0 + 42 * 15.0) / 1e6)
    (request,) = fake.requests
    assert request["path"] == "/v1/messages"
    assert request["headers"]["x-api-key"] == KEY and "authorization" not in request["headers"]
    assert request["headers"]["anthropic-version"] == "2023-06-01"
    body = request["body"]
    assert body["model"] == "claude-test" and body["max_tokens"] == 512 and body["stream"] is True
    assert body["system"] == "Be brief.\n\nAnswer now."
    assert body["tools"][0] == {
        "name": "http_get",
        "description": "Fetch a URL",
        "input_schema": {"type": "object", "properties": {"url": {"type": "string"}}},
    }
    assert body["tool_choice"] == {"type": "auto"}
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "fetch both"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "On it."},
                {"type": "tool_use", "id": "toolu_a", "name": "http_get", "input": {"url": "http://x"}},
                {"type": "tool_use", "id": "toolu_b", "name": "echo", "input": {}},
            ],
        },
        {  # the results of one turn's parallel calls: one user message
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_a", "content": '{"status": 200}'},
                {"type": "tool_result", "tool_use_id": "toolu_b", "content": '{"error": "x"}', "is_error": True},
            ],
        },
    ]


@pytest.mark.parametrize(
    "choice, expected",
    [("required", {"type": "any"}), ("echo", {"type": "tool", "name": "echo"})],
)
def test_tool_choice_is_translated(fake, make_provider, choice, expected):
    fake.push(text_answer("ok"))
    make_provider().complete(make_request(tools=TOOLS, tool_choice=choice), RecordingToken())
    assert fake.requests[0]["body"]["tool_choice"] == expected


def test_tool_choice_none_sends_no_tools(fake, make_provider):
    fake.push(text_answer("ok"))
    make_provider().complete(make_request(tools=TOOLS, tool_choice="none"), RecordingToken())
    assert "tools" not in fake.requests[0]["body"] and "tool_choice" not in fake.requests[0]["body"]


def test_parallel_tool_use_with_input_split_across_deltas(fake, make_provider):
    fake.push(
        tool_answer(
            ("toolu_1", "http_get", '{"url": "http://a"}'),
            ("toolu_2", "echo", '{"text": "b"}'),
            text="Let me look.",
        )
    )
    turn = make_provider().complete(make_request(tools=TOOLS), RecordingToken())
    assert turn.stop_reason is StopReason.TOOL_CALLS and turn.text == "Let me look."
    assert [(c.call_id, c.name, c.raw_arguments) for c in turn.tool_calls] == [
        ("toolu_1", "http_get", '{"url": "http://a"}'),
        ("toolu_2", "echo", '{"text": "b"}'),
    ]
    assert turn.usage.output_tokens == 9


def test_tool_use_without_input_deltas_is_the_empty_object(fake, make_provider):
    fake.push(
        events(
            message_start(),
            tool_start(0, "toolu_9", "echo"),
            block_stop(0),
            message_delta("tool_use", 3),
            MESSAGE_STOP,
        )
    )
    turn = make_provider().complete(make_request(tools=TOOLS), RecordingToken())
    assert [(c.name, c.raw_arguments) for c in turn.tool_calls] == [("echo", "{}")]


def test_malformed_tool_input_is_passed_through_raw(fake, make_provider):
    fake.push(
        events(
            message_start(),
            tool_start(0, "toolu_1", "echo"),
            json_delta(0, '{"text": '),
            json_delta(0, "oops"),
            block_stop(0),
            message_delta("tool_use", 3),
            MESSAGE_STOP,
        )
    )
    turn = make_provider().complete(make_request(tools=TOOLS), RecordingToken())
    assert turn.tool_calls[0].raw_arguments == '{"text": oops'  # the pipeline answers it as invalid arguments


# -- stop reasons ------------------------------------------------------------------


def test_max_tokens_maps_to_max_tokens(fake, make_provider):
    fake.push(text_answer("trunc", stop="max_tokens"))
    turn = make_provider().complete(make_request(), RecordingToken())
    assert turn.stop_reason is StopReason.MAX_TOKENS and turn.text == "trunc"


def test_refusal_is_a_permanent_error_that_carries_its_usage(fake, make_provider):
    fake.push(text_answer("I can", output_tokens=7, stop="refusal"), text_answer("must not be fetched"))
    with pytest.raises(ModelError) as info:
        make_provider().complete(make_request(), RecordingToken())
    exc = info.value
    assert exc.error_class == "ModelRefused" and exc.retryable is False and exc.stream_had_output is True
    assert exc.usage.output_tokens == 7 and exc.usage.cost_usd > 0
    assert len(fake.requests) == 1


# -- retries before output, never after ----------------------------------------------


def test_529_overloaded_honours_retry_after_then_succeeds(fake, make_provider):
    fake.push(answer(529, error_body("overloaded_error", "Overloaded"), {"Retry-After": "3"}), text_answer("done"))
    token = RecordingToken()
    turn = make_provider().complete(make_request(), token)
    assert turn.text == "done"
    assert len(fake.requests) == 2 and token.waits == [3.0]
    assert fake.requests[0]["body"] == fake.requests[1]["body"]


def test_529_on_every_try_is_a_transient_overload_after_three_tries(fake, make_provider):
    fake.push(answer(529, error_body("overloaded_error", "Overloaded sk-ant-leak-123")))
    with pytest.raises(ModelError) as info:
        make_provider().complete(make_request(), RecordingToken())
    exc = info.value
    assert exc.error_class == "ProviderOverloaded" and exc.retryable is True and exc.stream_had_output is False
    assert len(fake.requests) == 3 and "leak" not in str(exc) and "Overloaded" not in str(exc)


def test_overloaded_error_event_before_output_is_retried(fake, make_provider):
    fake.push(events(message_start(), {"type": "error", **error_body("overloaded_error")}), text_answer("again"))
    turn = make_provider().complete(make_request(), RecordingToken())
    assert turn.text == "again" and len(fake.requests) == 2


def test_error_event_after_output_is_not_retried(fake, make_provider):
    fake.push(
        events(message_start(), text_start(0), text_delta(0, "partial"), {"type": "error", **error_body("api_error")}),
        text_answer("must not be fetched"),
    )
    with pytest.raises(ModelError) as info:
        make_provider().complete(make_request(), RecordingToken())
    assert info.value.error_class == "ProviderStreamError" and info.value.stream_had_output is True
    assert len(fake.requests) == 1


def test_stream_cut_after_output_raises_never_retries_and_charges_the_attempt(fake, make_provider):
    fake.push(
        events(message_start(50), text_start(0), text_delta(0, "Hel"), text_delta(0, "lo"), cut_after=4),
        text_answer("must not be fetched"),
    )
    deltas: list[str] = []
    token = RecordingToken()
    with pytest.raises(ModelError) as info:
        make_provider(on_delta=deltas.append).complete(make_request(), token)
    exc = info.value
    assert exc.error_class == "StreamCutAfterOutput" and exc.retryable is True and exc.stream_had_output is True
    assert len(fake.requests) == 1 and token.waits == [] and deltas == ["Hel", "lo"]
    assert exc.usage is not None and exc.usage.input_tokens == 50 and exc.usage.cost_usd > 0
    assert_no_secret(exc)


def test_stream_cut_before_output_is_retried(fake, make_provider):
    fake.push(events(message_start(), text_start(0), cut_after=1), text_answer("second"))
    turn = make_provider().complete(make_request(), RecordingToken())
    assert turn.text == "second" and len(fake.requests) == 2


def test_stream_ending_without_message_stop_after_output_is_a_cut(fake, make_provider):
    fake.push(events(message_start(), text_start(0), text_delta(0, "half")))
    with pytest.raises(ModelError) as info:
        make_provider().complete(make_request(), RecordingToken())
    assert info.value.error_class == "StreamCutAfterOutput"


@pytest.mark.parametrize(
    "status, error_class",
    [(400, "BadRequest"), (401, "AuthenticationFailed"), (403, "PermissionDenied"), (404, "NotFound")],
)
def test_client_errors_are_permanent_and_not_retried(fake, make_provider, status, error_class):
    fake.push(answer(status, error_body("invalid_request_error", f"bad key {KEY}")))
    with pytest.raises(ModelError) as info:
        make_provider().complete(make_request(), RecordingToken())
    assert info.value.error_class == error_class and info.value.retryable is False
    assert len(fake.requests) == 1
    assert_no_secret(info.value)


def test_prompt_too_long_is_context_length_exceeded(fake, make_provider):
    fake.push(answer(400, error_body("invalid_request_error", "prompt is too long: 250000 tokens > 200000 maximum")))
    with pytest.raises(ModelError) as info:
        make_provider().complete(make_request(), RecordingToken())
    assert info.value.error_class == "ContextLengthExceeded" and "250000" not in str(info.value)


def test_missing_key_and_unpriced_model_fail_before_any_request(fake, make_provider, monkeypatch):
    with pytest.raises(ModelError) as info:
        make_provider(model="claude-unpriced").complete(make_request(), RecordingToken())
    assert info.value.error_class == "ModelNotPriced"
    monkeypatch.delenv("AGENTRT_TEST_ANTHROPIC_KEY")
    with pytest.raises(ModelError) as info:
        make_provider().complete(make_request(), RecordingToken())
    assert info.value.error_class == "MissingApiKey" and "AGENTRT_TEST_ANTHROPIC_KEY" not in str(info.value)
    assert fake.requests == []


# -- a whole JSON answer, cancellation --------------------------------------------------


def test_non_streaming_answer(fake, make_provider):
    fake.push(
        answer(
            200,
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Calling."},
                    {"type": "tool_use", "id": "toolu_7", "name": "echo", "input": {"text": "hi"}},
                ],
                "stop_reason": "tool_use",
                "usage": {"input_tokens": 12, "output_tokens": 4, "cache_read_input_tokens": 8},
            },
        )
    )
    turn = make_provider(stream=False).complete(make_request(tools=TOOLS), RecordingToken())
    assert fake.requests[0]["body"]["stream"] is False
    assert turn.text == "Calling." and turn.stop_reason is StopReason.TOOL_CALLS
    assert [(c.call_id, c.raw_arguments) for c in turn.tool_calls] == [("toolu_7", '{"text": "hi"}')]
    assert (turn.usage.input_tokens, turn.usage.cache_read_input_tokens) == (20, 8)


def test_cancellation_aborts_a_stalled_stream(fake, make_provider):
    fake.push(events(message_start(), text_start(0), text_delta(0, "thinking"), text_delta(0, "..."), stall_after=3))
    token = RecordingToken()
    timers: list[threading.Timer] = []

    def cancel_soon(text):
        if not timers:
            timers.append(threading.Timer(0.2, token.cancel, args=(CancelReason.REQUESTED,)))
            timers[0].start()

    turn = make_provider(read_timeout=3600, on_delta=cancel_soon).complete(make_request(), token)
    assert turn.stop_reason is StopReason.CANCELLED and turn.text == "thinking"
