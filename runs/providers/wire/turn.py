"""What one model attempt has accumulated: text, tool-call slots, usage."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from runs.domain.values import ToolCallRequest


@dataclass
class Slot:
    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class Turn:
    """What one attempt has accumulated so far."""

    text: list[str] = field(default_factory=list)
    slots: dict[int, Slot] = field(default_factory=dict)
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
        slot = self.slots.setdefault(index, Slot())
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
