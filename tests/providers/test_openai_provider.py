"""The `openai` adapter against a local server that speaks the protocol.

No database: the adapter is a plain object. Each test scripts the server's
answers, calls `complete()` once, and asserts on the turn, the error and the
requests the server received.
"""

from __future__ import annotations

import json
import random
import socket
import ssl
import threading

import pytest

from runs.domain.cancellation import Token
from runs.domain.errors import ModelError
from runs.domain.values import CancelReason, StopReason
from runs.providers.endpoints import Endpoint
from runs.providers.openai import OpenAIProvider
from tests.conftest import wait_for
from tests.providers.conftest import KEY, RecordingToken, make_request
from tests.providers.fake_openai import answer, chunk, hang, stream, text_stream, tool_delta, usage_chunk

TOOLS = [
    {
        "name": "http_get",
        "description": "Fetch a URL",
        "parameters": {"type": "object", "properties": {"url": {"type": "string"}}},
    },
    {"name": "echo", "description": "", "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}},
]


def assert_no_secret(exc: BaseException) -> None:
    for text in (str(exc), repr(exc), str(exc.args)):
        assert KEY not in text
        assert "SECRET" not in text


# -- request translation -------------------------------------------------------


def test_text_stream_usage_cost_and_request_translation(fake, make_provider):
    fake.push(
        stream(
            [
                chunk("", role="assistant"),
                chunk("Hel"),
                chunk("lo"),
                chunk(", world"),
                chunk(finish="stop"),
                usage_chunk(1000, 100, cached=400, reasoning=60),
            ]
        )
    )
    deltas: list[str] = []
    provider = make_provider(on_delta=deltas.append)
    conversation = [
        {"role": "user", "content": "fetch it"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_a", "name": "http_get", "arguments": '{"url": "http://x"}'},
                {"id": "call_b", "name": "echo", "arguments": "not json"},
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "name": "http_get", "content": '{"status": 200}', "is_error": False},
        {
            "role": "tool",
            "tool_call_id": "call_b",
            "name": "echo",
            "content": '{"error": "invalid_arguments"}',
            "is_error": True,
        },
        {"role": "assistant", "content": "Fetched.", "tool_calls": []},
        {"role": "user", "content": "thanks"},
    ]
    turn = provider.complete(make_request(conversation, tools=TOOLS, instructions="You are terse."), RecordingToken())

    assert turn.text == "Hello, world"
    assert turn.stop_reason is StopReason.END_TURN
    assert turn.tool_calls == []
    assert deltas == ["Hel", "lo", ", world"]
    usage = turn.usage
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_input_tokens, usage.reasoning_tokens) == (
        1000,
        100,
        400,
        60,
    )
    assert usage.cache_creation_input_tokens == 0
    assert usage.cost_usd == pytest.approx((600 * 2.0 + 400 * 0.5 + 100 * 8.0) / 1e6)

    [received] = fake.requests
    assert received["path"] == "/v1/chat/completions"
    assert received["headers"]["authorization"] == f"Bearer {KEY}"
    assert received["headers"]["content-type"] == "application/json"
    body = received["body"]
    assert body["model"] == "test-model"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["tool_choice"] == "auto" and body["parallel_tool_calls"] is True
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "http_get", "description": "Fetch a URL", "parameters": TOOLS[0]["parameters"]},
        },
        {"type": "function", "function": {"name": "echo", "description": "", "parameters": TOOLS[1]["parameters"]}},
    ]
    assert body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "fetch it"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "http_get", "arguments": '{"url": "http://x"}'},
                },
                {"id": "call_b", "type": "function", "function": {"name": "echo", "arguments": "not json"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": '{"status": 200}'},
        {"role": "tool", "tool_call_id": "call_b", "content": '{"error": "invalid_arguments"}'},
        {"role": "assistant", "content": "Fetched."},
        {"role": "user", "content": "thanks"},
    ]


def test_model_attempts_build_no_tls_context(fake, make_provider, monkeypatch):
    """Building a TLS client context loads the whole CA bundle: 20-50 ms of CPU
    that `httpx.Client()` spends before every request unless it is handed a
    context. Model attempts share the process's one (it was built before
    every model call, the first included: issue 16, submit -> first model call).
    Counted at the standard library, across attempts and provider instances."""
    fake.push(text_stream("hi"))
    make_provider().complete(make_request(), RecordingToken())  # the process's first call may build it
    built = []
    real = ssl.create_default_context
    monkeypatch.setattr(ssl, "create_default_context", lambda *a, **k: built.append(1) or real(*a, **k))
    for _ in range(3):
        assert make_provider().complete(make_request(), RecordingToken()).text == "hi"
    assert len(fake.requests) == 4
    assert built == [], f"{len(built)} TLS contexts built for 3 model attempts"


def test_tool_choice_none_sends_neither_tools_nor_tool_choice(fake, make_provider):
    fake.push(text_stream("ok"))
    make_provider().complete(make_request(tools=TOOLS, tool_choice="none", instructions=""), RecordingToken())
    body = fake.requests[0]["body"]
    assert "tools" not in body and "tool_choice" not in body and "parallel_tool_calls" not in body
    assert body["messages"] == [{"role": "user", "content": "hello"}]  # no empty system message


def test_no_tools_sends_no_tool_fields_and_named_choice_forces_a_function(fake, make_provider):
    fake.push(text_stream("ok"))
    provider = make_provider()
    provider.complete(make_request(), RecordingToken())
    assert "tools" not in fake.requests[0]["body"] and "tool_choice" not in fake.requests[0]["body"]
    provider.complete(make_request(tools=TOOLS, tool_choice="echo"), RecordingToken())
    assert fake.requests[1]["body"]["tool_choice"] == {"type": "function", "function": {"name": "echo"}}


# -- streamed tool calls -----------------------------------------------------------


def test_parallel_tool_calls_with_arguments_split_across_chunks(fake, make_provider):
    fake.push(
        stream(
            [
                chunk(role="assistant", tool_calls=[tool_delta(0, id="call_x", name="http_get", arguments="")]),
                chunk(tool_calls=[tool_delta(0, arguments='{"u')]),
                chunk(tool_calls=[tool_delta(1, id="call_y", name="echo", arguments='{"te')]),
                chunk(tool_calls=[tool_delta(0, arguments='rl": "http://a"}')]),
                chunk(tool_calls=[tool_delta(1, arguments='xt": "hi"}')]),
                chunk(finish="tool_calls"),
                usage_chunk(50, 20),
            ]
        )
    )
    turn = make_provider().complete(make_request(tools=TOOLS), RecordingToken())
    assert turn.stop_reason is StopReason.TOOL_CALLS
    assert turn.text is None
    assert [(c.call_id, c.name, c.raw_arguments) for c in turn.tool_calls] == [
        ("call_x", "http_get", '{"url": "http://a"}'),
        ("call_y", "echo", '{"text": "hi"}'),
    ]
    assert json.loads(turn.tool_calls[0].raw_arguments) == {"url": "http://a"}
    assert turn.usage.input_tokens == 50 and turn.usage.output_tokens == 20


def test_malformed_tool_arguments_are_passed_through_raw(fake, make_provider):
    fake.push(
        stream(
            [
                chunk(tool_calls=[tool_delta(0, id="call_1", name="echo", arguments='{"text": ')]),
                chunk(tool_calls=[tool_delta(0, arguments="oops}")]),
                chunk(finish="tool_calls"),
                usage_chunk(5, 5),
            ]
        )
    )
    turn = make_provider().complete(make_request(tools=TOOLS), RecordingToken())
    assert turn.tool_calls[0].raw_arguments == '{"text": oops}'
    assert turn.stop_reason is StopReason.TOOL_CALLS


def test_servers_without_index_or_ids_and_stop_with_tool_calls(fake, make_provider):
    # Ollama-style: whole calls, no `index`, finish_reason "stop"; one without an id.
    fake.push(
        stream(
            [
                chunk(
                    tool_calls=[
                        tool_delta(None, id="call_o1", name="echo", arguments='{"text": "a"}'),
                        tool_delta(None, id="call_o2", name="http_get", arguments='{"url": "b"}'),
                    ]
                ),
                chunk(finish="stop"),
                usage_chunk(5, 5),
            ]
        )
    )
    turn = make_provider().complete(make_request(tools=TOOLS, step=4), RecordingToken())
    assert [(c.call_id, c.name) for c in turn.tool_calls] == [("call_o1", "echo"), ("call_o2", "http_get")]
    assert turn.stop_reason is StopReason.TOOL_CALLS

    fake.script[:] = [
        stream([chunk(tool_calls=[tool_delta(0, name="echo", arguments="{}")]), chunk(finish="tool_calls")])
    ]
    fake.requests.clear()
    turn = make_provider().complete(make_request(tools=TOOLS, step=4), RecordingToken())
    assert turn.tool_calls[0].call_id == "call_4_0"  # synthesised like the scripted provider's ids


def test_length_maps_to_max_tokens(fake, make_provider):
    fake.push(text_stream("partial", finish="length"))
    turn = make_provider().complete(make_request(), RecordingToken())
    assert turn.stop_reason is StopReason.MAX_TOKENS and turn.text == "partial"


def test_empty_turn_is_returned_empty(fake, make_provider):
    fake.push(stream([chunk("", role="assistant"), chunk(finish="stop"), usage_chunk(12, 0)]))
    turn = make_provider().complete(make_request(), RecordingToken())
    assert turn.is_empty and turn.text is None and turn.tool_calls == []
    assert turn.usage.input_tokens == 12
    assert len(fake.requests) == 1  # the loop, not the provider, retries an empty turn


def test_missing_usage_is_estimated_never_free(fake, make_provider):
    fake.push(text_stream("four score and seven", usage=None))
    turn = make_provider().complete(make_request(), RecordingToken())
    assert turn.usage.input_tokens > 0 and turn.usage.output_tokens == 5  # 20 chars / 4
    assert turn.usage.cost_usd > 0


def test_cache_creation_tokens_where_reported(fake, make_provider):
    fake.push(
        stream([chunk("ok"), chunk(finish="stop"), usage_chunk(100, 1, cached=10, cache_creation_input_tokens=30)])
    )
    usage = make_provider().complete(make_request(), RecordingToken()).usage
    assert usage.cache_creation_input_tokens == 30 and usage.cache_read_input_tokens == 10
    assert usage.cost_usd == pytest.approx((60 * 2.0 + 10 * 0.5 + 30 * 2.0 + 1 * 8.0) / 1e6)


def test_sse_comments_and_event_fields_are_ignored(fake, make_provider):
    fake.push(
        stream(
            [
                ": keep-alive\n\n",
                f"event: message\nid: 1\ndata: {json.dumps(chunk('hi'))}\n\n",
                chunk(finish="stop"),
                usage_chunk(1, 1),
            ]
        )
    )
    assert make_provider().complete(make_request(), RecordingToken()).text == "hi"


def test_on_delta_errors_do_not_break_the_call(fake, make_provider):
    fake.push(text_stream("a", "b"))

    def broken(_text):
        raise RuntimeError("listener bug")

    assert make_provider(on_delta=broken).complete(make_request(), RecordingToken()).text == "ab"


# -- retries before output -------------------------------------------------------------


def test_429_honours_retry_after_then_succeeds(fake, make_provider):
    fake.push(answer(429, {"error": {"message": "slow down"}}, {"Retry-After": "2"}), text_stream("done"))
    token = RecordingToken()
    turn = make_provider().complete(make_request(), token)
    assert turn.text == "done"
    assert len(fake.requests) == 2
    assert token.waits == [2.0]
    assert fake.requests[0]["body"] == fake.requests[1]["body"]


def test_retry_after_ms_is_preferred(fake, make_provider):
    fake.push(answer(429, {}, {"retry-after-ms": "250", "Retry-After": "9"}), text_stream("done"))
    token = RecordingToken()
    make_provider().complete(make_request(), token)
    assert token.waits == [0.25]


def test_500_before_output_is_retried_with_seeded_jittered_backoff(fake, make_provider):
    fake.push(answer(500, {"error": {"message": "boom"}}), answer(503, "unavailable"), text_stream("finally"))
    token = RecordingToken()
    turn = make_provider(rng=random.Random(7), backoff_base=0.01).complete(make_request(), token)
    assert turn.text == "finally"
    assert len(fake.requests) == 3
    rng = random.Random(7)
    expected = [0.01 * (0.5 + 0.5 * rng.random()), 0.02 * (0.5 + 0.5 * rng.random())]
    assert token.waits == pytest.approx(expected)


@pytest.mark.parametrize(
    "status, error_class",
    [
        (500, "ProviderUnavailable"),
        (502, "ProviderUnavailable"),
        (503, "ProviderUnavailable"),
        (504, "ProviderUnavailable"),
        (429, "RateLimited"),
    ],
)
def test_retries_are_bounded_to_three_tries(fake, make_provider, status, error_class):
    fake.push(answer(status, {"error": {"message": f"provider says {KEY}"}}))
    token = RecordingToken()
    with pytest.raises(ModelError) as info:
        make_provider().complete(make_request(), token)
    exc = info.value
    assert exc.error_class == error_class
    assert exc.retryable is True and exc.stream_had_output is False
    assert len(fake.requests) == 3 and len(token.waits) == 2
    assert "provider says" not in str(exc)
    assert_no_secret(exc)


def test_retry_after_longer_than_the_cap_is_not_slept(fake, make_provider):
    fake.push(answer(429, {}, {"Retry-After": "3600"}))
    token = RecordingToken()
    with pytest.raises(ModelError) as info:
        make_provider().complete(make_request(), token)
    assert info.value.error_class == "RateLimited" and info.value.retryable
    assert token.waits == [] and len(fake.requests) == 1


def test_connect_errors_are_retried_then_classified(make_provider):
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    token = RecordingToken()
    with pytest.raises(ModelError) as info:
        make_provider(base_url=f"http://127.0.0.1:{port}/v1").complete(make_request(), token)
    assert info.value.error_class == "ConnectionFailed" and info.value.retryable
    assert info.value.stream_had_output is False
    assert len(token.waits) == 2


def test_timeout_before_first_delta_is_retried(fake, make_provider):
    fake.push(hang(5), text_stream("late but fine"))
    token = RecordingToken()
    turn = make_provider(read_timeout=0.3).complete(make_request(), token)
    assert turn.text == "late but fine"
    assert len(fake.requests) == 2 and len(token.waits) == 1


def test_stream_cut_before_output_is_retried(fake, make_provider):
    fake.push(stream([chunk("", role="assistant"), chunk("never sent")], cut_after=1), text_stream("second"))
    turn = make_provider().complete(make_request(), RecordingToken())
    assert turn.text == "second" and len(fake.requests) == 2


# -- no retry after output --------------------------------------------------------------


def test_stream_cut_after_output_raises_and_never_retries(fake, make_provider):
    fake.push(stream([chunk("Hel"), chunk("lo"), chunk(" there")], cut_after=2), text_stream("must not be fetched"))
    deltas: list[str] = []
    token = RecordingToken()
    with pytest.raises(ModelError) as info:
        make_provider(on_delta=deltas.append).complete(make_request(), token)
    exc = info.value
    assert exc.error_class == "StreamCutAfterOutput"
    assert exc.retryable is True and exc.stream_had_output is True
    assert len(fake.requests) == 1 and token.waits == []
    assert deltas == ["Hel", "lo"]
    assert_no_secret(exc)


def test_stream_ending_without_finish_after_output_is_a_cut(fake, make_provider):
    fake.push(stream([chunk("Hel")], done=False))  # clean end of body, but no finish_reason and no [DONE]
    with pytest.raises(ModelError) as info:
        make_provider().complete(make_request(), RecordingToken())
    assert info.value.error_class == "StreamCutAfterOutput" and info.value.stream_had_output
    assert len(fake.requests) == 1


def test_cut_after_the_finish_reason_keeps_the_turn(fake, make_provider):
    fake.push(stream([chunk("whole"), chunk(finish="stop"), usage_chunk(3, 1)], cut_after=2))
    turn = make_provider().complete(make_request(), RecordingToken())
    assert turn.text == "whole" and turn.stop_reason is StopReason.END_TURN
    assert turn.usage.output_tokens == 2  # usage never arrived: estimated
    assert len(fake.requests) == 1


def test_tool_call_delta_counts_as_output(fake, make_provider):
    fake.push(stream([chunk(tool_calls=[tool_delta(0, id="c", name="echo", arguments="{")])], cut_after=1))
    with pytest.raises(ModelError) as info:
        make_provider().complete(make_request(tools=TOOLS), RecordingToken())
    assert info.value.stream_had_output is True and len(fake.requests) == 1


def test_in_stream_error_after_output_is_not_retried(fake, make_provider):
    fake.push(stream([chunk("a"), {"error": {"message": f"overloaded {KEY}", "type": "server_error"}}]))
    with pytest.raises(ModelError) as info:
        make_provider().complete(make_request(), RecordingToken())
    assert info.value.error_class == "ProviderStreamError" and info.value.stream_had_output
    assert len(fake.requests) == 1
    assert_no_secret(info.value)


# -- permanent errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "status, error_class",
    [
        (400, "BadRequest"),
        (401, "AuthenticationFailed"),
        (403, "PermissionDenied"),
        (404, "NotFound"),
        (422, "BadRequest"),
    ],
)
def test_client_errors_are_permanent_and_not_retried(fake, make_provider, status, error_class):
    fake.push(answer(status, {"error": {"message": f"Incorrect API key provided: {KEY}", "code": "invalid_api_key"}}))
    token = RecordingToken()
    with pytest.raises(ModelError) as info:
        make_provider().complete(make_request(), token)
    exc = info.value
    assert exc.error_class == error_class
    assert exc.retryable is False and exc.stream_had_output is False
    assert len(fake.requests) == 1 and token.waits == []
    assert "Incorrect" not in str(exc)
    assert_no_secret(exc)


def test_context_length_is_classified(fake, make_provider):
    fake.push(answer(400, {"error": {"message": "too long", "code": "context_length_exceeded"}}))
    with pytest.raises(ModelError) as info:
        make_provider().complete(make_request(), RecordingToken())
    assert info.value.error_class == "ContextLengthExceeded" and not info.value.retryable


def test_missing_api_key_is_permanent_and_names_only_the_endpoint(fake, make_provider, monkeypatch):
    monkeypatch.delenv("AGENTRT_TEST_OPENAI_KEY")
    with pytest.raises(ModelError) as info:
        make_provider().complete(make_request(), RecordingToken())
    assert info.value.error_class == "MissingApiKey" and not info.value.retryable
    assert str(info.value) == "the model endpoint 'test' has no API key configured"
    assert "AGENTRT_TEST_OPENAI_KEY" not in str(info.value)  # a tenant never learns which variables exist
    assert fake.requests == []


def test_key_is_read_at_call_time(fake, make_provider, monkeypatch):
    fake.push(text_stream("ok"))
    provider = make_provider()
    monkeypatch.setenv("AGENTRT_TEST_OPENAI_KEY", "sk-rotated")
    provider.complete(make_request(), RecordingToken())
    assert fake.requests[0]["headers"]["authorization"] == "Bearer sk-rotated"
    assert KEY not in repr(provider) and KEY not in repr(vars(provider))


def test_unpriced_model_fails_before_any_request(fake, make_provider):
    with pytest.raises(ModelError) as info:
        make_provider(model="mystery-model").complete(make_request(), RecordingToken())
    assert info.value.error_class == "ModelNotPriced" and not info.value.retryable
    assert fake.requests == []


def test_repr_hides_credentials_in_the_url(priced):
    endpoint = Endpoint(
        name="internal", provider="openai", base_url="https://user:pw@llm.internal:8443/v1", api_key_env="K"
    )
    provider = OpenAIProvider(endpoint, "test-model")
    assert "pw" not in repr(provider) and "llm.internal:8443" in repr(provider)


# -- garbage ------------------------------------------------------------------------------------


def test_non_json_sse_before_output_is_malformed_and_not_retried_by_the_provider(fake, make_provider):
    fake.push(stream(["data: {not json\n\n"]))
    token = RecordingToken()
    with pytest.raises(ModelError) as info:
        make_provider().complete(make_request(), token)
    assert info.value.error_class == "MalformedResponse"
    assert info.value.retryable is True and info.value.stream_had_output is False
    assert len(fake.requests) == 1 and token.waits == []
    assert "not json" not in str(info.value)


def test_malformed_after_output_reports_output(fake, make_provider):
    fake.push(stream([chunk("partial"), "data: <html>oops</html>\n\n"]))
    with pytest.raises(ModelError) as info:
        make_provider().complete(make_request(), RecordingToken())
    assert info.value.error_class == "MalformedResponse" and info.value.stream_had_output is True
    assert "html" not in str(info.value)


def test_chunk_without_choices_is_malformed(fake, make_provider):
    fake.push(stream([{"id": "x", "object": "chat.completion.chunk"}]))
    with pytest.raises(ModelError) as info:
        make_provider().complete(make_request(), RecordingToken())
    assert info.value.error_class == "MalformedResponse"


def test_html_answer_is_malformed(fake, make_provider):
    fake.push(stream(["<html>proxy login</html>"], content_type="text/html", done=False))
    with pytest.raises(ModelError) as info:
        make_provider().complete(make_request(), RecordingToken())
    assert info.value.error_class == "MalformedResponse" and "proxy" not in str(info.value)


def test_json_answer_to_a_streaming_request_is_accepted(fake, make_provider):
    fake.push(
        answer(
            200,
            {
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "plain"}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 4, "completion_tokens": 1},
            },
        )
    )
    turn = make_provider().complete(make_request(), RecordingToken())
    assert turn.text == "plain" and turn.usage.input_tokens == 4


# -- cancellation and the call limit ---------------------------------------------------------------


def complete_or_hang(provider, token, within: float = 30.0):
    """provider.complete() in a thread, awaited as a condition: the scripted
    server never ends its answer on its own before the test ends, so the call
    returns only if the behaviour under test (a cancel, a call limit) ends it."""
    box: dict = {}

    def call():
        try:
            box["turn"] = provider.complete(make_request(), token)
        except BaseException as exc:  # handed to the test thread
            box["error"] = exc

    t = threading.Thread(target=call, daemon=True)
    t.start()
    wait_for(
        lambda: not t.is_alive(), timeout=within, message="complete() to return while the server still held the answer"
    )
    if "error" in box:
        raise box["error"]
    return box["turn"]


def _cancel_after(token, seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, token.cancel, [CancelReason.REQUESTED])
    timer.daemon = True
    timer.start()
    return timer


def _cancel_after_first_delta(token, deltas: list[str], seconds: float):
    """An on_delta that records deltas and arms the cancellation on the first one."""

    def on_delta(text: str) -> None:
        if not deltas:
            _cancel_after(token, seconds)
        deltas.append(text)

    return on_delta


def test_cancellation_aborts_a_slow_stream(fake, make_provider):
    fake.push(stream([chunk(f"w{i} ") for i in range(40)] + [chunk(finish="stop")], delay=0.1))
    token = RecordingToken()
    deltas: list[str] = []
    turn = make_provider(on_delta=_cancel_after_first_delta(token, deltas, 0.35)).complete(make_request(), token)
    assert turn.stop_reason is StopReason.CANCELLED
    # it hung up mid-stream: the server's next write found the client gone (a reader to the end never causes that)
    wait_for(lambda: 0 in fake.aborted, timeout=30, message="the server to see the client leave mid-stream")
    assert turn.text and turn.text.startswith("w0 ") and 1 <= len(deltas) < 40
    assert turn.text == "".join(deltas)
    assert turn.usage.output_tokens > 0  # what is known (estimated: no usage chunk came)


def test_cancellation_aborts_a_stalled_stream_at_once(fake, make_provider):
    fake.push(stream([chunk("thinking"), chunk("...")], stall_after=1, stall_for=3600))
    token = RecordingToken()
    deltas: list[str] = []
    # no read timeout to fall back on: only the cancel can end the call while the server stays silent
    turn = complete_or_hang(
        make_provider(read_timeout=3600, on_delta=_cancel_after_first_delta(token, deltas, 0.2)), token
    )
    assert turn.stop_reason is StopReason.CANCELLED and turn.text == "thinking"


def test_cancellation_before_the_answer_headers(fake, make_provider):
    fake.push(hang(3600))
    token = RecordingToken()
    _cancel_after(token, 0.3)
    turn = complete_or_hang(make_provider(read_timeout=3600), token)  # the server sends nothing until the test ends
    assert turn.stop_reason is StopReason.CANCELLED and turn.text is None
    assert len(fake.requests) <= 1 and token.waits == []


class CancelDuringWait(RecordingToken):
    """Cancels itself shortly after a backoff wait has begun."""

    def wait(self, timeout=None):
        self.waits.append(timeout)
        _cancel_after(self, 0.2)
        return Token.wait(self, timeout)


def test_cancellation_interrupts_the_backoff(fake, make_provider):
    fake.push(answer(429, {}, {"Retry-After": "30"}))
    token = CancelDuringWait()
    turn = complete_or_hang(make_provider(), token, within=20)  # a backoff that ran its course would take 30 s
    assert turn.stop_reason is StopReason.CANCELLED
    assert token.waits == [30.0] and len(fake.requests) == 1


def test_already_cancelled_token_sends_nothing(fake, make_provider):
    token = RecordingToken()
    token.cancel(CancelReason.DEADLINE)
    assert make_provider().complete(make_request(), token).stop_reason is StopReason.CANCELLED
    assert fake.requests == []


def test_call_limit_stops_a_stalled_stream(fake, make_provider):
    fake.push(stream([chunk("slow")], stall_after=1, stall_for=3600))
    with pytest.raises(ModelError) as info:  # no read timeout to fall back on: only the call limit ends it
        complete_or_hang(make_provider(max_call_seconds=1.0, read_timeout=3600), RecordingToken())
    assert info.value.error_class == "ModelCallTimeout"
    assert info.value.retryable and info.value.stream_had_output


# -- non-streaming mode ------------------------------------------------------------------------------


def test_non_streaming_mode(fake, make_provider):
    fake.push(
        answer(502, "bad gateway"),
        answer(
            200,
            {
                "id": "chatcmpl-2",
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "tool_calls",
                        "message": {
                            "role": "assistant",
                            "content": "Let me check.",
                            "tool_calls": [
                                {
                                    "id": "call_n1",
                                    "type": "function",
                                    "function": {"name": "http_get", "arguments": '{"url": "http://a"}'},
                                },
                                {
                                    "id": "call_n2",
                                    "type": "function",
                                    "function": {"name": "echo", "arguments": "{bad"},
                                },
                            ],
                        },
                    }
                ],
                "usage": {
                    "prompt_tokens": 30,
                    "completion_tokens": 12,
                    "prompt_tokens_details": {"cached_tokens": 10},
                    "completion_tokens_details": {"reasoning_tokens": 4},
                },
            },
        ),
    )
    deltas: list[str] = []
    token = RecordingToken()
    turn = make_provider(stream=False, on_delta=deltas.append).complete(make_request(tools=TOOLS), token)
    body = fake.requests[1]["body"]
    assert body["stream"] is False and "stream_options" not in body
    assert fake.requests[1]["headers"]["accept"] == "application/json"
    assert len(fake.requests) == 2 and len(token.waits) == 1
    assert turn.text == "Let me check." and deltas == ["Let me check."]
    assert turn.stop_reason is StopReason.TOOL_CALLS
    assert [(c.call_id, c.name, c.raw_arguments) for c in turn.tool_calls] == [
        ("call_n1", "http_get", '{"url": "http://a"}'),
        ("call_n2", "echo", "{bad"),
    ]
    assert (
        turn.usage.input_tokens,
        turn.usage.output_tokens,
        turn.usage.cache_read_input_tokens,
        turn.usage.reasoning_tokens,
    ) == (30, 12, 10, 4)


def test_non_streaming_garbage_and_no_choices(fake, make_provider):
    fake.push(answer(200, "<html>"), answer(200, {"choices": []}))
    provider = make_provider(stream=False)
    for _ in range(2):
        with pytest.raises(ModelError) as info:
            provider.complete(make_request(), RecordingToken())
        assert info.value.error_class == "MalformedResponse" and info.value.stream_had_output is False


def test_non_streaming_cancellation(fake, make_provider):
    fake.push(hang(3600))
    token = RecordingToken()
    _cancel_after(token, 0.3)
    turn = complete_or_hang(make_provider(stream=False, read_timeout=3600), token)
    assert turn.stop_reason is StopReason.CANCELLED
