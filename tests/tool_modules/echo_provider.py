"""A project's own model provider, registered by declaration
(`AGENTRT_PROVIDER_MODULES=tests.tool_modules.echo_provider`): it answers
every request with the last user message, reversed."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from runs.domain.values import ModelTurn, ModelUsage, StopReason
from runs.providers import register_provider
from runs.providers.config import Strict


class EchoModel(Strict):
    provider: Literal["echo_model"]
    shout: bool = False
    context_window: int | None = Field(8_000, ge=256)


class EchoProvider:
    def __init__(self, block: dict):
        self.shout = bool(block.get("shout"))

    def complete(self, request, token) -> ModelTurn:
        last = next((m for m in reversed(request.messages) if m.get("role") == "user"), {"content": ""})
        text = str(last.get("content") or "")[::-1]
        return ModelTurn(
            text=text.upper() if self.shout else text,
            stop_reason=StopReason.END_TURN,
            usage=ModelUsage(input_tokens=1, output_tokens=1),
        )


@register_provider("echo_model", config=EchoModel)
def build(block: dict, on_delta=None) -> EchoProvider:
    return EchoProvider(block)
