"""`AnthropicProvider`: the Messages request, its status classes, the event
stream and the usage report, on the shared HTTP flow of
`runs.providers.wire.base` (see the package docstring)."""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import httpx

from runs.domain.errors import ModelError
from runs.domain.values import ModelRequest, ModelTurn, ModelUsage, StopReason, ToolCallRequest
from runs.providers import prices
from runs.providers.anthropic.messages import translate
from runs.providers.wire.base import HTTPModelProvider
from runs.providers.wire.retry import Retry, count, read_limited, retry_after
from runs.providers.wire.turn import Slot, Turn

API_VERSION = "2023-06-01"
PERMANENT_STATUSES = {
    400: "BadRequest",
    401: "AuthenticationFailed",
    403: "PermissionDenied",
    404: "NotFound",
    413: "RequestTooLarge",
    422: "BadRequest",
}
RETRY_STATUSES = {408: "ProviderTimeout", 409: "ProviderConflict", 429: "RateLimited", 529: "ProviderOverloaded"}
STOP_REASONS = {
    "end_turn": StopReason.END_TURN,
    "stop_sequence": StopReason.END_TURN,
    "pause_turn": StopReason.END_TURN,
    "tool_use": StopReason.TOOL_CALLS,
    "max_tokens": StopReason.MAX_TOKENS,
    "model_context_window_exceeded": StopReason.MAX_TOKENS,
}


class AnthropicProvider(HTTPModelProvider):
    """`ModelProvider` for Anthropic's Messages API."""

    name = "anthropic"
    log = logging.getLogger("agentrt.providers.anthropic")

    def __init__(self, endpoint, model: str, *, max_tokens: int = 4096, **kwargs: Any):
        super().__init__(endpoint, model, **kwargs)
        if max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        self.max_tokens = max_tokens

    def url(self) -> str:
        return f"{self.base_url}/messages"

    def auth_headers(self, key: str) -> dict[str, str]:
        return {"x-api-key": key, "anthropic-version": API_VERSION}

    # -- the request --------------------------------------------------------

    def build_body(self, request: ModelRequest) -> dict[str, Any]:
        """The Messages body of `request` (pure)."""
        system, messages = translate(request.instructions, list(request.messages))
        body: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "messages": messages}
        if system:
            body["system"] = system
        choice = request.tool_choice or "auto"
        if request.tools and choice != "none":
            body["tools"] = [
                {
                    "name": tool["name"],
                    "description": tool.get("description") or "",
                    "input_schema": tool.get("parameters") or {"type": "object", "properties": {}},
                }
                for tool in request.tools
            ]
            if choice == "auto":
                body["tool_choice"] = {"type": "auto"}
            elif choice == "required":
                body["tool_choice"] = {"type": "any"}
            else:
                body["tool_choice"] = {"type": "tool", "name": choice}
        body["stream"] = bool(self.stream)
        return body

    # -- statuses ------------------------------------------------------------

    def raise_status(self, response: httpx.Response) -> None:
        status = response.status_code
        wait = retry_after(response.headers)
        if status in RETRY_STATUSES:
            raise Retry(RETRY_STATUSES[status], f"the model server answered HTTP {status}", wait)
        if status >= 500:
            raise Retry("ProviderUnavailable", f"the model server answered HTTP {status}", wait)
        if status in (400, 413) and _too_long(read_limited(response)):
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

    # -- the event stream -----------------------------------------------------

    def on_event(self, data: str, turn: Turn) -> None:
        try:
            event = json.loads(data)
        except ValueError:
            raise self._malformed(turn, "data that is not JSON") from None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise self._malformed(turn, "an event without a type")
        kind = event["type"]
        try:
            if kind == "message_start":
                message = event.get("message") or {}
                if not isinstance(message, dict):
                    raise ValueError("message")
                self._usage_update(turn, message.get("usage"))
            elif kind == "content_block_start":
                self._block_start(turn, event.get("index"), event.get("content_block"))
            elif kind == "content_block_delta":
                self._block_delta(turn, event.get("index"), event.get("delta"))
            elif kind == "content_block_stop":
                self._block_stop(turn, event.get("index"))
            elif kind == "message_delta":
                delta = event.get("delta") or {}
                if not isinstance(delta, dict):
                    raise ValueError("delta")
                if isinstance(delta.get("stop_reason"), str):
                    turn.finish_reason = delta["stop_reason"]
                self._usage_update(turn, event.get("usage"))
            elif kind == "message_stop":
                turn.done = True
            elif kind == "error":
                error = event.get("error") if isinstance(event.get("error"), dict) else {}
                overloaded = error.get("type") == "overloaded_error"
                error_class = "ProviderOverloaded" if overloaded else "ProviderStreamError"
                if turn.had_output:
                    raise ModelError(
                        error_class,
                        "the model server reported an error mid-stream",
                        transient=True,
                        stream_had_output=True,
                    )
                raise Retry(error_class, "the model server reported an error in the stream")
            # ping and any event type added later are ignored
        except ValueError:
            raise self._malformed(turn, f"a {kind} event of the wrong shape") from None

    def _usage_update(self, turn: Turn, usage: Any) -> None:
        if usage is None:
            return
        if not isinstance(usage, dict):
            raise ValueError("usage")
        # message_start carries the input side, message_delta the (cumulative) output.
        merged = dict(turn.usage or {})
        merged.update({k: v for k, v in usage.items() if v is not None})
        turn.usage = merged

    def _block_start(self, turn: Turn, index: Any, block: Any) -> None:
        if isinstance(index, bool) or not isinstance(index, int) or not isinstance(block, dict):
            raise ValueError("content_block_start")
        if block.get("type") == "text":
            text = block.get("text") or ""
            if not isinstance(text, str):
                raise ValueError("text")
            if text:
                turn.text.append(text)
                turn.had_output = True
                self._emit(text)
        elif block.get("type") == "tool_use":
            name, call_id = block.get("name"), block.get("id")
            if not isinstance(name, str) or not name:
                raise ValueError("tool_use name")
            slot = turn.slots.setdefault(index, Slot())
            slot.id = call_id if isinstance(call_id, str) and call_id else None
            slot.name = name
            initial = block.get("input")
            if isinstance(initial, dict) and initial:  # a server that sends the input whole
                slot.arguments.append(json.dumps(initial, ensure_ascii=False))
            turn.had_output = True

    def _block_delta(self, turn: Turn, index: Any, delta: Any) -> None:
        if not isinstance(delta, dict):
            raise ValueError("delta")
        kind = delta.get("type")
        if kind == "text_delta":
            text = delta.get("text")
            if not isinstance(text, str):
                raise ValueError("text")
            if text:
                turn.text.append(text)
                turn.had_output = True
                self._emit(text)
        elif kind == "input_json_delta":
            piece = delta.get("partial_json")
            if not isinstance(piece, str) or index not in turn.slots:
                raise ValueError("input_json_delta")
            turn.slots[index].arguments.append(piece)
            turn.had_output = True
        # thinking_delta, signature_delta, citations_delta: not part of the turn we keep

    def _block_stop(self, turn: Turn, index: Any) -> None:
        slot = turn.slots.get(index)
        if slot is not None and not "".join(slot.arguments).strip():
            slot.arguments[:] = ["{}"]  # a tool_use without input deltas has the empty object as input

    # -- a whole JSON answer (stream off, or a server that ignored it) --------

    def read_json(self, response: httpx.Response, turn: Turn) -> None:
        try:
            answer = json.loads(response.read())
        except ValueError:
            raise self._malformed(turn, "a body that is not JSON") from None
        if not isinstance(answer, dict):
            raise self._malformed(turn, "a body that is not an object")
        if answer.get("type") == "error":
            raise Retry("ProviderStreamError", "the model server reported an error")
        content = answer.get("content")
        if not isinstance(content, list):
            raise self._malformed(turn, "an answer without content")
        try:
            for index, block in enumerate(content):
                self._block_start(turn, index, block)
                self._block_stop(turn, index)
            self._usage_update(turn, answer.get("usage"))
        except ValueError:
            raise self._malformed(turn, "content of the wrong shape") from None
        turn.finish_reason = answer.get("stop_reason") if isinstance(answer.get("stop_reason"), str) else "end_turn"
        turn.done = True

    # -- the turn ----------------------------------------------------------------

    def finish(
        self, request: ModelRequest, body: dict, turn: Turn, price: prices.Price, *, cancelled: bool
    ) -> ModelTurn:
        calls = turn.calls(request.step_number)
        text = "".join(turn.text) or None
        usage = self.usage_of(turn.usage) if turn.usage is not None else None
        if usage is None:
            usage = self.estimate(body, text, calls)
        usage["cost_usd"] = price.cost_usd(**usage)
        if cancelled:
            stop = StopReason.CANCELLED
        elif turn.finish_reason == "refusal":
            raise ModelError(
                "ModelRefused",
                "the model declined to continue (stop reason: refusal)",
                transient=False,
                stream_had_output=turn.had_output,
                usage=ModelUsage(**usage),
            )
        elif calls:
            stop = StopReason.TOOL_CALLS
        else:
            stop = STOP_REASONS.get(turn.finish_reason or "end_turn", StopReason.END_TURN)
            if stop is StopReason.TOOL_CALLS:
                stop = StopReason.END_TURN  # tool_use with no complete block: nothing to run
        return ModelTurn(text=text, tool_calls=calls, stop_reason=stop, usage=ModelUsage(**usage))

    def usage_of(self, raw: dict) -> dict[str, Any] | None:
        if "input_tokens" not in raw and "output_tokens" not in raw:
            return None
        read = count(raw.get("cache_read_input_tokens"))
        creation = count(raw.get("cache_creation_input_tokens"))
        return {
            "input_tokens": count(raw.get("input_tokens")) + read + creation,
            "output_tokens": count(raw.get("output_tokens")),
            "cache_read_input_tokens": read,
            "cache_creation_input_tokens": creation,
            "reasoning_tokens": 0,
        }

    def estimate(self, body: dict, text: str | None, calls: list[ToolCallRequest]) -> dict[str, Any]:
        """≈ 4 characters a token, rounded up: for a stream cut before usage arrived."""
        prompt = (
            json.dumps(body.get("system", ""), ensure_ascii=False)
            + json.dumps(body.get("messages", []), ensure_ascii=False)
            + json.dumps(body.get("tools", []), ensure_ascii=False)
        )
        output = (text or "") + "".join(c.name + c.raw_arguments for c in calls)
        return {
            "input_tokens": math.ceil(len(prompt) / 4),
            "output_tokens": math.ceil(len(output) / 4),
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
            "reasoning_tokens": 0,
        }


def _too_long(body: bytes) -> bool:
    """Whether a 400/413 error body says the prompt is too long (read, never repeated)."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return False
    message = error.get("message") if isinstance(error, dict) else None
    return isinstance(message, str) and "too long" in message.lower()  # "prompt is too long: N tokens > M maximum"
