"""`OpenAIProvider`: the chat-completions request, its status classes and the
usage report, on the shared HTTP flow of `runs.providers.wire.base`."""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import httpx

from runs.domain.values import ModelRequest, ModelTurn, ModelUsage, StopReason, ToolCallRequest
from runs.providers import prices
from runs.providers.openai import errors
from runs.providers.openai.messages import translate_message
from runs.providers.openai.stream import ChatCompletionsReader
from runs.providers.wire.base import HTTPModelProvider
from runs.providers.wire.retry import count as _int
from runs.providers.wire.turn import Turn


class OpenAIProvider(ChatCompletionsReader, HTTPModelProvider):
    """`ModelProvider` for OpenAI-compatible chat completions."""

    name = "openai"
    log = logging.getLogger("agentrt.providers.openai")

    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def auth_headers(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    def raise_status(self, response: httpx.Response) -> None:
        errors.raise_status(response)

    # -- the request --------------------------------------------------------

    def build_body(self, request: ModelRequest) -> dict[str, Any]:
        """The chat-completions body of `request` (pure)."""
        messages: list[dict[str, Any]] = []
        if request.instructions:
            messages.append({"role": "system", "content": request.instructions})
        for message in request.messages:
            messages.append(translate_message(message))
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

    def finish(
        self, request: ModelRequest, body: dict, turn: Turn, price: prices.Price, *, cancelled: bool
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
        usage = self.usage_of(turn.usage) if turn.usage is not None else None
        if usage is None:
            usage = self.estimate(body, text, calls)
        usage["cost_usd"] = price.cost_usd(**usage)
        return ModelTurn(text=text, tool_calls=calls, stop_reason=stop, usage=ModelUsage(**usage))

    def usage_of(self, raw: dict) -> dict[str, Any] | None:
        return usage_of(raw)

    def estimate(self, body: dict, text: str | None, calls: list[ToolCallRequest]) -> dict[str, Any]:
        return estimate(body, text, calls)


def usage_of(raw: dict) -> dict[str, Any] | None:
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


def estimate(body: dict, text: str | None, calls: list[ToolCallRequest]) -> dict[str, Any]:
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
