"""The scripted provider: turn n is played at step n.

A turn is `{"text"}`, `{"tool_calls"}`, either with `delay_ms` and `usage`,
`{"empty": true}`, `{"error": "transient"}` (or `"permanent"`; with
`usage` the failed attempt spent that, and `"stream_had_output": true`
plays a stream cut after output), or
`{"attempts": [turn, ...]}` where attempt k plays the k-th (the last
repeats). Steps past the script replay its last turn. Tool call ids are
`call_<step>_<index>` (index from 0).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, field_validator

from runs.domain.errors import ModelError
from runs.domain.values import ModelRequest, ModelTurn, ModelUsage, StopReason, ToolCallRequest
from runs.providers.config import Strict
from runs.providers.registry import register_provider


class ScriptedModel(Strict):
    provider: Literal["scripted"]
    context_window: int | None = Field(None, ge=256, le=10_000_000)
    turns: list[dict[str, Any]] = Field(default_factory=list, max_length=10000)

    @field_validator("turns")
    @classmethod
    def _turns(cls, turns):
        allowed = {
            "text",
            "tool_calls",
            "delay_ms",
            "usage",
            "empty",
            "error",
            "attempts",
            "stop_reason",
            "stream_had_output",
        }
        for i, turn in enumerate(turns):
            if not isinstance(turn, dict):
                raise ValueError(f"turn {i} must be an object")
            unknown = set(turn) - allowed
            if unknown:
                raise ValueError(f"turn {i} has unknown keys: {sorted(unknown)}")
            if "error" in turn and turn["error"] not in ("transient", "permanent"):
                raise ValueError(f"turn {i}: error must be 'transient' or 'permanent'")
            if "delay_ms" in turn and (not isinstance(turn["delay_ms"], (int, float)) or turn["delay_ms"] < 0):
                raise ValueError(f"turn {i}: delay_ms must be a non-negative number")
            for call in turn.get("tool_calls") or []:
                if not isinstance(call, dict) or "name" not in call:
                    raise ValueError(f"turn {i}: every tool call needs a name")
            for sub in turn.get("attempts") or []:
                if not isinstance(sub, dict):
                    raise ValueError(f"turn {i}: attempts must be objects")
        return turns


class ScriptedProvider:
    def __init__(self, model: dict):
        self.turns = list(model.get("turns") or [])

    def _turn(self, step: int, attempt: int) -> dict:
        if not self.turns:
            return {"text": ""}
        turn = self.turns[min(step, len(self.turns)) - 1]
        if "attempts" in turn:
            attempts = turn["attempts"] or [{"text": ""}]
            turn = attempts[min(attempt, len(attempts)) - 1]
        return turn

    def complete(self, request: ModelRequest, token) -> ModelTurn:
        turn = self._turn(request.step_number, request.attempt_number)
        delay = turn.get("delay_ms")
        if delay:
            if token.wait(delay / 1000.0) is not None:
                return ModelTurn(stop_reason=StopReason.CANCELLED)
        usage = ModelUsage(**{k: v for k, v in (turn.get("usage") or {}).items() if k in ModelUsage.model_fields})
        error = turn.get("error")
        if error:
            raise ModelError(
                "ScriptedTransientError" if error == "transient" else "ScriptedPermanentError",
                f"scripted {error} error",
                transient=error == "transient",
                stream_had_output=bool(turn.get("stream_had_output", False)),
                usage=usage if turn.get("usage") else None,
            )
        if turn.get("empty"):
            return ModelTurn(usage=usage)
        calls = []
        for index, call in enumerate(turn.get("tool_calls") or []):
            args = call.get("arguments", {})
            calls.append(
                ToolCallRequest(
                    call_id=f"call_{request.step_number}_{index}",
                    name=str(call.get("name", "")),
                    raw_arguments=args if isinstance(args, str) else json.dumps(args),
                )
            )
        stop = StopReason.TOOL_CALLS if calls else StopReason(turn.get("stop_reason", "end_turn"))
        return ModelTurn(text=turn.get("text"), tool_calls=calls, stop_reason=stop, usage=usage)


@register_provider("scripted", config=ScriptedModel)
def build(block: dict, on_delta=None) -> ScriptedProvider:
    return ScriptedProvider(block)
