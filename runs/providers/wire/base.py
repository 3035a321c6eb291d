"""The HTTP model-provider base: one `complete()` is one model *attempt*
(three retry loops, three owners), whatever the wire protocol.

A subclass says where the request goes (`url`), how it is authenticated
(`auth_headers`), the body (`build_body`), how a non-200 status is classified
(`raise_status`), how a stream event and a JSON answer accumulate into a
`Turn` (`on_event`, `read_json`) and how the turn becomes a `ModelTurn`
(`finish`, `usage_of`, `estimate`). The base owns what every provider must do
the same way: the price check before any request, the key read from the
environment at each call and never kept, retries only before output (at most
`max_tries`, exponential backoff with jitter, `Retry-After` honoured, every
sleep a `token.wait`), the watchdog that abandons a stalled stream on
cancellation or the call deadline, one `ConnectionFailed` class for every
connection-level failure before output, and the usage of a failed attempt
that had output.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httpx

from runs.clock import CLOCK
from runs.domain.errors import ModelError
from runs.domain.values import ModelRequest, ModelTurn, ModelUsage, StopReason
from runs.providers import prices
from runs.providers.endpoints import Endpoint
from runs.providers.wire import pool
from runs.providers.wire.retry import Retry as _Retry
from runs.providers.wire.retry import default_max_call_seconds
from runs.providers.wire.turn import Turn as _Turn
from runs.providers.wire.watchdog import Watchdog

_DRAIN_LIMIT = 64 * 1024
_DRAIN_SECONDS = 1.0


def _drain(lines) -> None:
    """Read the rest of a finished stream (its closing chunk, a trailing
    blank line) so that its connection is whole and can be kept for the next
    attempt; a server that goes on talking past the end is not waited for
    beyond `_DRAIN_LIMIT` characters (the connection is then closed)."""
    left = _DRAIN_LIMIT
    for line in lines:
        left -= len(line) + 1
        if left < 0:
            return


class HTTPModelProvider:
    """Shared flow of an HTTP `ModelProvider` (see the module docstring)."""

    name = "http"
    log = logging.getLogger("agentrt.providers")

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
        max_wait: float | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float = 120.0,
        max_call_seconds: float | None = None,
        watchdog_poll: float = 0.05,
    ):
        if not isinstance(endpoint, Endpoint):
            raise TypeError(
                f"{type(self).__name__} takes a configured Endpoint (runs.providers.endpoints), never an agent's block"
            )
        parts = urlsplit(endpoint.base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("the endpoint needs an http(s) base_url")
        if not model:
            raise ValueError(f"the {self.name} provider needs a model name")
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
        self.max_wait = max_wait  # the waits between the tries of one attempt, in all (None: only max_tries bounds)
        self.timeout = httpx.Timeout(
            connect=connect_timeout, read=read_timeout, write=read_timeout, pool=connect_timeout
        )
        self.max_call_seconds = default_max_call_seconds() if max_call_seconds is None else max_call_seconds
        self.watchdog_poll = watchdog_poll

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(endpoint={self.endpoint.name!r}, base_url={self.endpoint.shown_url()!r}, "
            f"model={self.model!r}, stream={self.stream})"
        )

    # -- what a protocol says -------------------------------------------------

    def url(self) -> str:
        raise NotImplementedError

    def auth_headers(self, key: str) -> dict[str, str]:
        raise NotImplementedError

    def build_body(self, request: ModelRequest) -> dict[str, Any]:
        raise NotImplementedError

    def raise_status(self, response: httpx.Response) -> None:
        raise NotImplementedError

    def on_event(self, data: str, turn: _Turn) -> None:
        """One `data:` line of the event stream."""
        raise NotImplementedError

    def read_json(self, response: httpx.Response, turn: _Turn) -> None:
        raise NotImplementedError

    def finish(
        self, request: ModelRequest, body: dict, turn: _Turn, price: prices.Price, *, cancelled: bool
    ) -> ModelTurn:
        raise NotImplementedError

    def usage_of(self, raw: dict) -> dict[str, Any] | None:
        raise NotImplementedError

    def estimate(self, body: dict, text: str | None, calls: list) -> dict[str, Any]:
        raise NotImplementedError

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
            self.log.warning(
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
            **self.auth_headers(key),
            "Content-Type": "application/json",
            "Accept": "text/event-stream" if self.stream else "application/json",
            "User-Agent": "agentrt",
        }
        del key
        deadline = CLOCK.monotonic() + self.max_call_seconds if self.max_call_seconds else None
        tries = 0
        waited = 0.0
        while True:
            tries += 1
            try:
                return self._attempt(request, body, payload, headers, token, price, deadline)
            except _Retry as failure:
                self.log.info("model attempt try %d failed before output: %s", tries, failure.error_class)
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
                if self.max_wait is not None and waited + delay > self.max_wait:
                    raise ModelError(
                        failure.error_class,
                        f"{failure.message} (gave up after {tries} tries: waiting {delay:.1f}s more would pass the"
                        f" {self.max_wait:.0f}s the retry policy allows)",
                        transient=True,
                    ) from None
                waited += delay
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
        usage = self.usage_of(turn.usage) if turn.usage is not None else None
        if usage is None:
            usage = self.estimate(body, "".join(turn.text) or None, turn.calls(step_number))
        usage["cost_usd"] = price.cost_usd(**usage)
        return ModelUsage(**usage)

    def _attempt_on(self, turn: _Turn, request, body, payload, headers, token, price, deadline) -> ModelTurn:
        watchdog = Watchdog(token, deadline, self.watchdog_poll, name=f"agentrt-{self.name}-watchdog")
        watchdog.start()
        try:
            with (
                pool.attached(watchdog),
                pool.client().stream(
                    "POST", self.url(), content=payload, headers=headers, timeout=self.timeout
                ) as response,
            ):
                try:
                    if response.status_code != 200:
                        self.raise_status(response)
                    content_type = response.headers.get("content-type", "").lower()
                    if self.stream and "text/event-stream" in content_type:
                        self._read_stream(response, turn, token, watchdog)
                    elif not self.stream or "json" in content_type:  # a server that ignored `stream`
                        self.read_json(response, turn)
                    else:
                        raise self._malformed(turn, "an answer that is neither an event stream nor JSON")
                finally:
                    watchdog.stop()  # before the response closes: its connection may be lent to the next attempt
        except (_Retry, ModelError):
            if token.reason is not None:
                return self.finish(request, body, turn, price, cancelled=True)
            raise
        except (httpx.TransportError, httpx.StreamError) as exc:
            if token.reason is not None:
                return self.finish(request, body, turn, price, cancelled=True)
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
                self.log.warning(
                    "model endpoint %r (%s): connection failed before any output: %s",
                    self.endpoint.name,
                    self.endpoint.shown_url(),
                    type(exc).__name__,
                )
                raise _Retry("ConnectionFailed", "could not reach the model server") from None
        finally:
            watchdog.stop()
        if token.reason is not None:
            return self.finish(request, body, turn, price, cancelled=True)
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
            self.log.warning("model endpoint %r: the stream ended before any output", self.endpoint.name)
            raise _Retry("ConnectionFailed", "could not reach the model server")
        return self.finish(request, body, turn, price, cancelled=False)

    def _malformed(self, turn: _Turn, what: str) -> ModelError:
        return ModelError(
            "MalformedResponse", f"the model server sent {what}", transient=True, stream_had_output=turn.had_output
        )

    def _read_stream(self, response: httpx.Response, turn: _Turn, token, watchdog: Watchdog) -> None:
        # Server-sent events: every protocol here sends one JSON object per
        # `data:` line, so each data line is handled as it comes (a server that
        # omits the blank line between events still works). Comments
        # (`: ping`) and other fields (`event:`, `id:`) are ignored.
        lines = response.iter_lines()
        for line in lines:
            if token.reason is not None:
                return
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            if name != "data":
                continue
            self.on_event(value[1:] if value.startswith(" ") else value, turn)
            if turn.done:
                # The turn is whole: read the stream's end so the connection
                # can be kept, but never let a server that stalls there (or
                # breaks off) hold the attempt up or cost it its answer.
                watchdog.wind_down(_DRAIN_SECONDS)
                try:
                    _drain(lines)
                except (httpx.TransportError, httpx.StreamError):
                    pass
                return

    def _emit(self, text: str) -> None:
        if self.on_delta is None:
            return
        try:
            self.on_delta(text)
        except Exception as exc:  # a listener's bug never breaks the model call
            self.log.warning("on_delta raised %s; the delta is dropped", type(exc).__name__)
