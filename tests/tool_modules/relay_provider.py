"""A model for the delegation tests (`AGENTRT_PROVIDER_MODULES=tests.tool_modules.relay_provider`): its
first turn delegates each configured piece of work (`delegate_run`, all in one batch); once the results are
in, it answers with every child's answer — or its error — joined, so a test can read the parent's answer and
see that both results reached the model."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import Field

from runs.domain.values import ModelTurn, ModelUsage, StopReason, ToolCallRequest
from runs.providers import register_provider
from runs.providers.config import Strict


class Work(Strict):
    agent: str
    input: str


class RelayModel(Strict):
    provider: Literal["relay"]
    delegate: list[Work] = Field(min_length=1)
    context_window: int | None = Field(8_000, ge=256)


class RelayProvider:
    def __init__(self, block: dict):
        self.work = [Work(**w) for w in block["delegate"]]

    def complete(self, request, token) -> ModelTurn:
        usage = ModelUsage(input_tokens=2, output_tokens=1)
        results = [m for m in request.messages if m.get("role") == "tool"]
        if not results:
            calls = [
                ToolCallRequest(
                    call_id=f"call_{request.step_number}_{i}",
                    name="delegate_run",
                    raw_arguments=json.dumps({"agent": w.agent, "input": w.input}),
                )
                for i, w in enumerate(self.work)
            ]
            return ModelTurn(tool_calls=calls, stop_reason=StopReason.TOOL_CALLS, usage=usage)
        parts = []
        for message in results:
            content = json.loads(message["content"])
            parts.append(content.get("answer") or f"{content.get('error')}: {content.get('message')}")
        return ModelTurn(text=" | ".join(parts), stop_reason=StopReason.END_TURN, usage=usage)


@register_provider("relay", config=RelayModel)
def build(block: dict, on_delta=None) -> RelayProvider:
    return RelayProvider(block)
