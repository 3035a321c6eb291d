"""The `openai` provider (DESIGN §13, §16): any OpenAI-compatible
chat-completions endpoint with tool calling — OpenAI, vLLM, Ollama,
llama.cpp server.

Agent block: `{"provider": "openai", "endpoint": "openai", "model":
"gpt-4o-mini"}`. The endpoint (base URL and the variable holding the key) is
operator configuration (`runs/providers/endpoints.py`,
`AGENTRT_MODEL_ENDPOINTS`); the adapter is built only from a configured
`Endpoint`, never from an agent's block. One `complete()` is one model
*attempt* (seed 002, "Retry: three loops, three owners"):

* It POSTs `{base_url}/chat/completions` with `stream: true` and
  `stream_options.include_usage`, and accumulates text and tool-call deltas
  (by `index`, arguments concatenated; raw argument text is passed through
  even when it is not JSON — the tool pipeline answers that to the model).
* Retries are the provider's only while nothing has been streamed
  (`stream_had_output` false): HTTP 408/409/429/5xx, connect errors, timeouts
  and a connection lost before the first delta; at most `max_tries` (3) tries,
  exponential backoff with jitter from an injectable RNG, `Retry-After`
  (or `retry-after-ms`) honoured, every sleep a `token.wait(delay)` so
  cancellation interrupts it. Once a text or tool-call delta has arrived, any
  failure is `ModelError(transient=True, stream_had_output=True)` and never
  retried here: the loop decides.
* 400/401/403/404/422 (and any other 4xx) are permanent.
* Garbage (non-JSON data, a chunk with neither `choices` nor `usage`, a body
  of the wrong type) is `MalformedResponse`, transient (the loop may retry
  the step; the provider does not retry it itself, since a server that speaks
  another protocol answers the same way again), with `stream_had_output` as
  it stands.
* The cancellation token is checked between chunks; a watchdog thread also
  shuts the socket down when the token is set (or the call outlives
  `max_call_seconds`), so a stalled stream is abandoned at once. Cancelled →
  `ModelTurn(stop_reason=cancelled)` with the usage known so far.
* The API key is read from `os.environ[endpoint.api_key_env]` at each call,
  sent as a Bearer header, never stored, logged or put in a message. Error
  messages are the adapter's own words: no provider text, no URL, no variable
  name (a missing key says which *endpoint* lacks one; the worker log names
  the variable). Every connection-level failure before output is one class,
  `ConnectionFailed`, with one message; the log has the detail.
* Usage: `prompt_tokens` → input (cache reads included), `completion_tokens`
  → output (reasoning included), `cached_tokens` → cache read,
  `reasoning_tokens`, cache creation where a compatible server reports it.
  A server that reports no usage gets a conservative estimate (≈ 4 characters
  a token) so budgets still bind. A failed attempt that had output (a cut
  stream, a mid-stream error, a timeout after output) carries its usage on
  the `ModelError`: what the server reported before the cut, else the same
  estimate over the whole prompt and the output received; the loop charges
  it. A failure before any output is not charged (nothing was generated).
  Cost comes from `prices.py`; an unpriced model is a permanent
  `ModelNotPriced` error, never free.

`tool_choice` "none": neither `tools` nor `tool_choice` is sent (the loop
already builds such requests with no tools, and OpenAI refuses a
`tool_choice` without `tools`). Otherwise "auto"/"required" pass through, and
any other value names a function to force.
"""

from __future__ import annotations

import email.utils
import json
import logging
import math
import os
import random
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any
from urllib.parse import urlsplit

import httpx

from runs.clock import CLOCK
from runs.domain.errors import ModelError
from runs.domain.values import ModelRequest, ModelTurn, ModelUsage, StopReason, ToolCallRequest
from runs.providers import prices
from runs.providers.endpoints import Endpoint

log = logging.getLogger("agentrt.providers.openai")

PERMANENT_STATUSES = {
    400: "BadRequest",
    401: "AuthenticationFailed",
    403: "PermissionDenied",
    404: "NotFound",
    422: "BadRequest",
}
RETRY_STATUSES = {408: "ProviderTimeout", 409: "ProviderConflict", 429: "RateLimited"}
CONTEXT_CODES = {"context_length_exceeded", "string_above_max_length"}
ERROR_BODY_LIMIT = 64 * 1024


def _default_max_call_seconds() -> float:
    try:
        from django.conf import settings

        if settings.configured:
            return float(getattr(settings, "AGENTRT_MAX_CALL_SECONDS", 300))
    except Exception:  # pragma: no cover - settings unusable: fall back
        pass
    return 300.0


class _Retry(Exception):
    """A failure before any output: the provider may try again."""

    def __init__(self, error_class: str, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.error_class = error_class
        self.message = message
        self.retry_after = retry_after


class _Watchdog:
    """Shuts the attempt's socket down when the token is set or the call's
    deadline passes, so a read blocked on a silent server returns at once.

    The socket is learnt from httpcore's `trace` extension. `stop()` is called
    before the client closes the socket, under the same lock as a shutdown, so
    a shutdown never reaches a closed (or reused) descriptor.
    """

    def __init__(self, token, deadline: float | None, poll: float = 0.05):
        self.token = token
        self.deadline = deadline
        self.poll = poll
        self.fired: str | None = None  # "cancel" | "deadline"
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentrt-openai-watchdog", daemon=True)

    def trace(self, name: str, info: dict) -> None:
        if not (name.endswith("connect_tcp.complete") or name.endswith("start_tls.complete")):
            return
        stream = (info or {}).get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is None:
            return
        with self._lock:
            if self._finished.is_set():
                return
            self._sock = sock
            if self.fired:
                self._shutdown(sock)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._finished.wait(self.poll):
            if self.token.reason is not None:
                self._fire("cancel")
                return
            if self.deadline is not None and CLOCK.monotonic() >= self.deadline:
                self._fire("deadline")
                return

    def _fire(self, why: str) -> None:
        with self._lock:
            if self._finished.is_set():
                return
            self.fired = why
            if self._sock is not None:
                self._shutdown(self._sock)

    @staticmethod
    def _shutdown(sock: socket.socket) -> None:
        try:  # the base method: for a TLS socket, leave the SSL object alone
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:
            pass

    def stop(self) -> None:
        with self._lock:
            self._finished.set()


@dataclass
class _Slot:
    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class _Turn:
    """What one attempt has accumulated so far."""

    text: list[str] = field(default_factory=list)
    slots: dict[int, _Slot] = field(default_factory=dict)
    by_id: dict[str, int] = field(default_factory=dict)
    last_slot: int | None = None
    finish_reason: str | None = None
    usage: dict | None = None
    done: bool = False
    had_output: bool = False

    def add_call_delta(self, delta: Any) -> None:
        if not isinstance(delta, dict):
            raise ValueError("tool call delta is not an object")
        index = delta.get("index")
        call_id = delta.get("id") if isinstance(delta.get("id"), str) and delta.get("id") else None
        if isinstance(index, bool) or not isinstance(index, int):
            # Servers that omit `index` (older Ollama): an id names the call,
            # a delta without one continues the last call.
            if call_id is not None and call_id in self.by_id:
                index = self.by_id[call_id]
            elif call_id is not None or self.last_slot is None:
                index = max(self.slots, default=-1) + 1
            else:
                index = self.last_slot
        slot = self.slots.setdefault(index, _Slot())
        self.last_slot = index
        if call_id is not None and slot.id is None:
            slot.id = call_id
            self.by_id[call_id] = index
        function = delta.get("function") or {}
        if not isinstance(function, dict):
            raise ValueError("tool call function is not an object")
        name = function.get("name")
        if isinstance(name, str) and name and not slot.name:
            slot.name = name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            slot.arguments.append(arguments)
        elif arguments is not None:  # a server that sends an object: keep it as JSON text
            slot.arguments.append(json.dumps(arguments, ensure_ascii=False))
        self.had_output = True

    def calls(self, step_number: int) -> list[ToolCallRequest]:
        return [
            ToolCallRequest(
                call_id=slot.id or f"call_{step_number}_{position}",
                name=slot.name,
                raw_arguments="".join(slot.arguments),
            )
            for position, (_, slot) in enumerate(sorted(self.slots.items()))
        ]

    @property
    def complete(self) -> bool:
        return self.done or self.finish_reason is not None


class OpenAIProvider:
    """`ModelProvider` for OpenAI-compatible chat completions."""

    def __init__(
        self,
        endpoint: Endpoint,
        model: str,
        *,
        on_delta: Callable[[str], None] | None = None,
        stream: bool = True,
        rng: random.Random | None = None,
        max_tries: int = 3,
        backoff_base: float = 0.5,
        backoff_cap: float = 8.0,
        max_retry_after: float = 60.0,
        connect_timeout: float = 10.0,
        read_timeout: float = 120.0,
        max_call_seconds: float | None = None,
        watchdog_poll: float = 0.05,
    ):
        if not isinstance(endpoint, Endpoint):
            raise TypeError(
                "OpenAIProvider takes a configured Endpoint (runs.providers.endpoints), never an agent's block"
            )
        parts = urlsplit(endpoint.base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("the endpoint needs an http(s) base_url")
        if not model:
            raise ValueError("the openai provider needs a model name")
        if max_tries < 1:
            raise ValueError("max_tries must be at least 1")
        self.endpoint = endpoint
        self.base_url = endpoint.base_url.rstrip("/")
        self.model = str(model)
        self.api_key_env = endpoint.api_key_env
        self.on_delta = on_delta
        self.stream = stream
        self.rng = rng or random.Random()
        self.max_tries = max_tries
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.max_retry_after = max_retry_after
        self.timeout = httpx.Timeout(
            connect=connect_timeout, read=read_timeout, write=read_timeout, pool=connect_timeout
        )
        self.max_call_seconds = _default_max_call_seconds() if max_call_seconds is None else max_call_seconds
        self.watchdog_poll = watchdog_poll

    def __repr__(self) -> str:
        return (
            f"OpenAIProvider(endpoint={self.endpoint.name!r}, base_url={self.endpoint.shown_url()!r}, "
            f"model={self.model!r}, stream={self.stream})"
        )

    # -- the request --------------------------------------------------------

    def build_body(self, request: ModelRequest) -> dict[str, Any]:
        """The chat-completions body of `request` (pure)."""
        messages: list[dict[str, Any]] = []
        if request.instructions:
            messages.append({"role": "system", "content": request.instructions})
        for message in request.messages:
            messages.append(_translate_message(message))
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        choice = request.tool_choice or "auto"
        if request.tools and choice != "none":
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": tool["name"],
                        "description": tool.get("description") or "",
                        "parameters": tool.get("parameters") or {"type": "object", "properties": {}},
                    },
                }
                for tool in request.tools
            ]
            if choice in ("auto", "required"):
                body["tool_choice"] = choice
            else:
                body["tool_choice"] = {"type": "function", "function": {"name": choice}}
            body["parallel_tool_calls"] = True
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        else:
            body["stream"] = False
        return body

    # -- one model attempt ---------------------------------------------------

    def complete(self, request: ModelRequest, token) -> ModelTurn:
        if token.reason is not None:
            return ModelTurn(stop_reason=StopReason.CANCELLED)
        try:
            price = prices.price_for(self.model)
        except ValueError:
            raise ModelError(
                "ModelNotPriced",
                f"the price of model {self.model!r} in AGENTRT_MODEL_PRICES is invalid",
                transient=False,
            ) from None
        if price is None:
            raise ModelError(
                "ModelNotPriced", f"the model {self.model!r} has no price in AGENTRT_MODEL_PRICES", transient=False
            )
        key = os.environ.get(self.api_key_env)
        if not key:
            # The operator sees which variable; a tenant sees only the endpoint's name.
            log.warning(
                "model endpoint %r: the API key variable %s is not set in this worker",
                self.endpoint.name,
                self.api_key_env,
            )
            raise ModelError(
                "MissingApiKey", f"the model endpoint {self.endpoint.name!r} has no API key configured", transient=False
            )
        body = self.build_body(request)
        payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        headers = {
            "Authorization": f"Bearer {key}",
            "Content-Type": "application/json",
            "Accept": "text/event-stream" if self.stream else "application/json",
            "User-Agent": "agentrt",
        }
        del key
        deadline = CLOCK.monotonic() + self.max_call_seconds if self.max_call_seconds else None
        tries = 0
        while True:
            tries += 1
            try:
                return self._attempt(request, body, payload, headers, token, price, deadline)
            except _Retry as failure:
                log.info("model attempt try %d failed before output: %s", tries, failure.error_class)
                if tries >= self.max_tries:
                    raise ModelError(
                        failure.error_class, f"{failure.message} (gave up after {tries} tries)", transient=True
                    ) from None
                delay = self._delay(tries, failure.retry_after)
                if failure.retry_after is not None and failure.retry_after > self.max_retry_after:
                    raise ModelError(
                        failure.error_class,
                        f"{failure.message}; the provider asked to wait {failure.retry_after:.0f}s, "
                        f"longer than {self.max_retry_after:.0f}s",
                        transient=True,
                    ) from None
                if deadline is not None and CLOCK.monotonic() + delay >= deadline:
                    raise ModelError(
                        failure.error_class,
                        f"{failure.message} (no time left to retry within the call limit)",
                        transient=True,
                    ) from None
                if token.wait(delay) is not None:
                    return ModelTurn(stop_reason=StopReason.CANCELLED)

    def _delay(self, tries: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return max(0.0, retry_after)
        exponential = min(self.backoff_cap, self.backoff_base * (2 ** (tries - 1)))
        return exponential * (0.5 + 0.5 * self.rng.random())  # "equal jitter"

    def _attempt(self, request, body, payload, headers, token, price, deadline) -> ModelTurn:
        turn = _Turn()
        try:
            return self._attempt_on(turn, request, body, payload, headers, token, price, deadline)
        except ModelError as exc:
            # A failed attempt that produced output (or reported usage) was
            # paid for: say what it spent, so the loop charges it.
            if exc.usage is None and (turn.had_output or turn.usage is not None):
                exc.usage = self._spent(body, turn, request.step_number, price)
            raise

    def _spent(self, body: dict, turn: _Turn, step_number: int, price: prices.Price) -> ModelUsage:
        """What a failed attempt cost: the usage the server reported before the
        failure, else an estimate (≈ 4 characters a token, the whole prompt
        and the output received so far) — a server that cut the stream never
        says what it charged, so the estimate leans high on input."""
        usage = _usage(turn.usage) if turn.usage is not None else None
        if usage is None:
            usage = _estimate(body, "".join(turn.text) or None, turn.calls(step_number))
        usage["cost_usd"] = price.cost_usd(**usage)
        return ModelUsage(**usage)

    def _attempt_on(self, turn: _Turn, request, body, payload, headers, token, price, deadline) -> ModelTurn:
        watchdog = _Watchdog(token, deadline, self.watchdog_poll)
        client = httpx.Client(
            timeout=self.timeout,
            limits=httpx.Limits(max_keepalive_connections=0),  # a fresh socket per attempt, for the watchdog
            follow_redirects=False,
        )
        watchdog.start()
        try:
            with client.stream(
                "POST",
                f"{self.base_url}/chat/completions",
                content=payload,
                headers=headers,
                extensions={"trace": watchdog.trace},
            ) as response:
                if response.status_code != 200:
                    self._raise_status(response)
                content_type = response.headers.get("content-type", "").lower()
                if self.stream and "text/event-stream" in content_type:
                    self._read_stream(response, turn, token)
                elif not self.stream or "json" in content_type:  # a server that ignored `stream`
                    self._read_json(response, turn)
                else:
                    raise self._malformed(turn, "an answer that is neither an event stream nor JSON")
        except (_Retry, ModelError):
            if token.reason is not None:
                return self._finish(request, body, turn, price, cancelled=True)
            raise
        except (httpx.TransportError, httpx.StreamError) as exc:
            if token.reason is not None:
                return self._finish(request, body, turn, price, cancelled=True)
            if watchdog.fired == "deadline":
                raise ModelError(
                    "ModelCallTimeout",
                    f"the model call took longer than {self.max_call_seconds:.0f}s",
                    transient=True,
                    stream_had_output=turn.had_output,
                ) from None
            if turn.complete and self.stream:
                pass  # the turn was whole (finish_reason or [DONE]); only the tail was lost
            elif turn.had_output:
                raise ModelError(
                    "StreamCutAfterOutput",
                    f"the stream broke after output ({type(exc).__name__})",
                    transient=True,
                    stream_had_output=True,
                ) from None
            else:
                # One class and one message for every connection-level failure
                # before output (refused, timed out, reset, not HTTP): the
                # difference is an oracle about the network behind the worker.
                # The operator finds the detail in the worker log.
                log.warning(
                    "model endpoint %r (%s): connection failed before any output: %s",
                    self.endpoint.name,
                    self.endpoint.shown_url(),
                    type(exc).__name__,
                )
                raise _Retry("ConnectionFailed", "could not reach the model server") from None
        finally:
            watchdog.stop()
            client.close()
        if token.reason is not None:
            return self._finish(request, body, turn, price, cancelled=True)
        if watchdog.fired == "deadline":
            raise ModelError(
                "ModelCallTimeout",
                f"the model call took longer than {self.max_call_seconds:.0f}s",
                transient=True,
                stream_had_output=turn.had_output,
            )
        if not turn.complete:
            if turn.had_output:
                raise ModelError(
                    "StreamCutAfterOutput",
                    "the stream ended after output without a finish reason",
                    transient=True,
                    stream_had_output=True,
                )
            log.warning("model endpoint %r: the stream ended before any output", self.endpoint.name)
            raise _Retry("ConnectionFailed", "could not reach the model server")
        return self._finish(request, body, turn, price, cancelled=False)

    # -- answers -------------------------------------------------------------

    def _raise_status(self, response: httpx.Response) -> None:
        status = response.status_code
        retry_after = _retry_after(response.headers)
        code = None
        if status in (400, 413, 422):
            code = _error_code(_read_limited(response))
        if status in RETRY_STATUSES:
            raise _Retry(RETRY_STATUSES[status], f"the model server answered HTTP {status}", retry_after)
        if status >= 500:
            raise _Retry("ProviderUnavailable", f"the model server answered HTTP {status}", retry_after)
        if code in CONTEXT_CODES:
            raise ModelError(
                "ContextLengthExceeded",
                f"the model server answered HTTP {status}: the context is too long",
                transient=False,
            )
        if status in PERMANENT_STATUSES:
            raise ModelError(PERMANENT_STATUSES[status], f"the model server answered HTTP {status}", transient=False)
        if 400 <= status < 500:
            raise ModelError("BadRequest", f"the model server answered HTTP {status}", transient=False)
        raise ModelError("UnexpectedStatus", f"the model server answered HTTP {status}", transient=False)

    def _malformed(self, turn: _Turn, what: str) -> ModelError:
        return ModelError(
            "MalformedResponse", f"the model server sent {what}", transient=True, stream_had_output=turn.had_output
        )

    def _read_stream(self, response: httpx.Response, turn: _Turn, token) -> None:
        # Every OpenAI-compatible server sends one JSON object per `data:`
        # line, so each data line is handled as it comes (a server that omits
        # the blank line between events still works). Comments (`: ping`)
        # and other fields (`event:`, `id:`) are ignored.
        for line in response.iter_lines():
            if token.reason is not None:
                return
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            if name != "data":
                continue
            self._chunk(value[1:] if value.startswith(" ") else value, turn)
            if turn.done:
                return

    def _chunk(self, data: str, turn: _Turn) -> None:
        if data.strip() == "[DONE]":
            turn.done = True
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            raise self._malformed(turn, "data that is not JSON") from None
        if not isinstance(chunk, dict):
            raise self._malformed(turn, "a chunk that is not an object")
        if chunk.get("error"):
            if turn.had_output:
                raise ModelError(
                    "ProviderStreamError",
                    "the model server reported an error mid-stream",
                    transient=True,
                    stream_had_output=True,
                )
            raise _Retry("ProviderStreamError", "the model server reported an error in the stream")
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            turn.usage = usage
        choices = chunk.get("choices")
        if choices is None:
            if isinstance(usage, dict):
                return  # the usage chunk
            raise self._malformed(turn, "a chunk without choices")
        if not isinstance(choices, list):
            raise self._malformed(turn, "choices that are not a list")
        for choice in choices:
            if not isinstance(choice, dict):
                raise self._malformed(turn, "a choice that is not an object")
            position = choice.get("index")
            if isinstance(position, int) and not isinstance(position, bool) and position != 0:
                continue  # n=1 is asked for; ignore any other choice
            delta = choice.get("delta")
            if delta is None:
                delta = choice.get("message") or {}
            try:
                self._delta(delta, turn)
            except ValueError:
                raise self._malformed(turn, "a delta of the wrong shape") from None
            finish = choice.get("finish_reason")
            if isinstance(finish, str) and finish:
                turn.finish_reason = finish

    def _delta(self, delta: Any, turn: _Turn) -> None:
        if not isinstance(delta, dict):
            raise ValueError("delta")
        content = delta.get("content")
        if content is not None and not isinstance(content, str):
            raise ValueError("content")
        if content:
            turn.text.append(content)
            turn.had_output = True
            self._emit(content)
        calls = delta.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise ValueError("tool_calls")
            for call in calls:
                turn.add_call_delta(call)

    def _emit(self, text: str) -> None:
        if self.on_delta is None:
            return
        try:
            self.on_delta(text)
        except Exception as exc:  # a listener's bug never breaks the model call
            log.warning("on_delta raised %s; the delta is dropped", type(exc).__name__)

    def _read_json(self, response: httpx.Response, turn: _Turn) -> None:
        try:
            answer = json.loads(response.read())
        except ValueError:
            raise self._malformed(turn, "a body that is not JSON") from None
        if not isinstance(answer, dict):
            raise self._malformed(turn, "a body that is not an object")
        if answer.get("error"):
            raise _Retry("ProviderStreamError", "the model server reported an error")
        choices = answer.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise self._malformed(turn, "an answer without choices")
        message = choices[0].get("message")
        if not isinstance(message, dict):
            raise self._malformed(turn, "an answer without a message")
        calls = message.get("tool_calls")
        if isinstance(calls, list):  # whole calls: give them positions for the accumulator
            message = dict(
                message, tool_calls=[dict(c, index=i) if isinstance(c, dict) else c for i, c in enumerate(calls)]
            )
        try:
            self._delta(message, turn)
        except ValueError:
            raise self._malformed(turn, "a message of the wrong shape") from None
        turn.finish_reason = choices[0].get("finish_reason") or "stop"
        if isinstance(answer.get("usage"), dict):
            turn.usage = answer["usage"]
        turn.done = True

    def _finish(
        self, request: ModelRequest, body: dict, turn: _Turn, price: prices.Price, *, cancelled: bool
    ) -> ModelTurn:
        calls = turn.calls(request.step_number)
        text = "".join(turn.text) or None
        if cancelled:
            stop = StopReason.CANCELLED
        elif turn.finish_reason == "length":
            stop = StopReason.MAX_TOKENS
        elif calls or turn.finish_reason in ("tool_calls", "function_call"):
            stop = StopReason.TOOL_CALLS if calls else StopReason.END_TURN
        else:
            stop = StopReason.END_TURN  # stop, content_filter, or none given
        usage = _usage(turn.usage) if turn.usage is not None else None
        if usage is None:
            usage = _estimate(body, text, calls)
        usage["cost_usd"] = price.cost_usd(**usage)
        return ModelTurn(text=text, tool_calls=calls, stop_reason=stop, usage=ModelUsage(**usage))


# -- helpers -------------------------------------------------------------------


def _translate_message(message: dict[str, Any]) -> dict[str, Any]:
    role = message.get("role")
    content = message.get("content")
    if role == "assistant":
        out: dict[str, Any] = {"role": "assistant"}
        calls = [
            {
                "id": call.get("id"),
                "type": "function",
                "function": {"name": call.get("name"), "arguments": _argument_text(call.get("arguments"))},
            }
            for call in message.get("tool_calls") or []
        ]
        if calls:
            out["content"] = content or None
            out["tool_calls"] = calls
        else:
            out["content"] = content or ""
        return out
    if role == "tool":
        if not isinstance(content, str):
            content = json.dumps(content, ensure_ascii=False)
        return {"role": "tool", "tool_call_id": message.get("tool_call_id"), "content": content}
    return {"role": role or "user", "content": content if content is not None else ""}


def _argument_text(arguments: Any) -> str:
    if isinstance(arguments, str):
        return arguments or "{}"
    if arguments is None:
        return "{}"
    return json.dumps(arguments, ensure_ascii=False)


def _retry_after(headers: httpx.Headers) -> float | None:
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(0.0, float(value) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        seconds = float(value)
        return max(0.0, seconds) if math.isfinite(seconds) else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - CLOCK.now()).total_seconds())


def _read_limited(response: httpx.Response) -> bytes:
    data = bytearray()
    try:
        for piece in response.iter_bytes():
            data += piece
            if len(data) >= ERROR_BODY_LIMIT:
                break
    except (httpx.TransportError, httpx.StreamError):
        pass
    return bytes(data[:ERROR_BODY_LIMIT])


def _error_code(body: bytes) -> str | None:
    """The machine code of an error body (`error.code` / `error.type`), if any."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    if isinstance(error, dict):
        for key in ("code", "type"):
            if isinstance(error.get(key), str):
                return error[key]
    return None


def _int(value: Any) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(0, value)
    if isinstance(value, float) and math.isfinite(value):
        return max(0, int(value))
    return 0


def _usage(raw: dict) -> dict[str, Any] | None:
    if "prompt_tokens" not in raw and "completion_tokens" not in raw:
        return None
    prompt_details = raw.get("prompt_tokens_details") if isinstance(raw.get("prompt_tokens_details"), dict) else {}
    completion_details = (
        raw.get("completion_tokens_details") if isinstance(raw.get("completion_tokens_details"), dict) else {}
    )
    creation = (
        raw.get("cache_creation_input_tokens")
        or prompt_details.get("cache_creation_tokens")
        or prompt_details.get("cache_write_tokens")
    )
    return {
        "input_tokens": _int(raw.get("prompt_tokens")),
        "output_tokens": _int(raw.get("completion_tokens")),
        "cache_read_input_tokens": _int(prompt_details.get("cached_tokens")),
        "cache_creation_input_tokens": _int(creation),
        "reasoning_tokens": _int(completion_details.get("reasoning_tokens")),
    }


def _estimate(body: dict, text: str | None, calls: list[ToolCallRequest]) -> dict[str, Any]:
    """≈ 4 characters a token, rounded up: for servers that report no usage."""
    prompt = json.dumps(body.get("messages", []), ensure_ascii=False) + json.dumps(
        body.get("tools", []), ensure_ascii=False
    )
    output = (text or "") + "".join(c.name + c.raw_arguments for c in calls)
    return {
        "input_tokens": math.ceil(len(prompt) / 4),
        "output_tokens": math.ceil(len(output) / 4),
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
        "reasoning_tokens": 0,
    }
