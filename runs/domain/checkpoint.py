"""The loop's working state and seed 002's full/delta checkpoint rule."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from runs.domain.working_state import WorkingState
from runs.domain.writes import CheckpointInsert

FULL_EVERY = 8
FULL_TRIGGERS = frozenset({"compaction", "suspension", "final", "terminal", "seed", "approval_resolved"})


def is_full(version: int, trigger: str) -> bool:
    """Version 1, every eighth version, compaction, suspension and terminal are full."""
    return version == 1 or version % FULL_EVERY == 1 or trigger in FULL_TRIGGERS


@dataclass
class CheckpointState:
    """What `CheckpointRepository.latest()` materialises and the loop works on."""

    conversation: list[dict[str, Any]] = field(default_factory=list)
    step: int = 0  # last step whose model response is in the conversation
    pending_tool_calls: list[dict[str, Any]] = field(default_factory=list)
    identical_calls: dict[str, int] = field(default_factory=dict)
    denials: int = 0
    last_tool_error: str | None = None  # runtime carry (working_state.py)
    question_id: str | None = None  # runtime carry (working_state.py)
    version: int = 0
    last_full_version: int = 0
    saved_len: int = 0  # conversation items already persisted in the chain
    needs_full: bool = False  # rebuilt without a chain: the next write must be full
    _written: dict[str, int] = field(default_factory=dict)  # identical-call counts as of the last write

    def count_call(self, fingerprint: str) -> None:
        self.identical_calls[fingerprint] = self.identical_calls.get(fingerprint, 0) + 1

    def working(self) -> WorkingState:
        """The runtime's working state: four fields of this checkpoint."""
        return WorkingState(
            step=self.step,
            last_tool_error=self.last_tool_error,
            consecutive_denials=self.denials,
            question_id=self.question_id,
        )

    def carry(self, working: WorkingState) -> None:
        """Adopt the runtime's write (`apply_runtime_carry`); the next checkpoint persists it."""
        self.step = working.step
        self.last_tool_error = working.last_tool_error
        self.denials = working.consecutive_denials
        self.question_id = working.question_id

    def scalars(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "pending_tool_calls": self.pending_tool_calls,
            "denials": self.denials,
            "last_tool_error": self.last_tool_error,
            "question_id": self.question_id,
        }

    def next_checkpoint(self, trigger: str, at: datetime, *, force_full: bool = False) -> CheckpointInsert:
        """Advance the version and return the row to write (full or delta)."""
        version = self.version + 1
        full = force_full or self.needs_full or is_full(version, trigger)
        self.needs_full = False
        state = self.scalars()
        if full:
            state["conversation"] = list(self.conversation)
            state["identical_calls"] = dict(self.identical_calls)
            base = None
            self.last_full_version = version
        else:
            # A delta carries only what changed since the previous version.
            state["items"] = self.conversation[self.saved_len :]
            state["identical_calls_changed"] = {
                k: v for k, v in self.identical_calls.items() if self._written.get(k) != v
            }
            base = self.last_full_version
        self._written = dict(self.identical_calls)
        self.version = version
        self.saved_len = len(self.conversation)
        return CheckpointInsert(
            version=version, full=full, base_version=base, trigger=trigger, state=state, created_at=at
        )

    @classmethod
    def materialise(cls, rows: list[tuple[int, bool, dict[str, Any]]]) -> CheckpointState | None:
        """Rebuild the state from a full row followed by its deltas, in version
        order; None when the chain is broken (a missing version)."""
        if not rows or not rows[0][1]:
            return None
        conversation = list(rows[0][2].get("conversation", []))
        identical = dict(rows[0][2].get("identical_calls", {}))
        expected = rows[0][0]
        for version, full, state in rows[1:]:
            expected += 1
            if version != expected or full:
                return None
            conversation.extend(state.get("items", []))
            identical.update(state.get("identical_calls_changed", {}))
            identical.update(state.get("identical_calls", {}))  # deltas written before the change-only form
        last_version, _, last = rows[-1]
        return cls(
            conversation=conversation,
            step=last.get("step", 0),
            pending_tool_calls=list(last.get("pending_tool_calls", [])),
            identical_calls=identical,
            denials=last.get("denials", 0),
            last_tool_error=last.get("last_tool_error"),
            question_id=last.get("question_id"),
            version=last_version,
            last_full_version=rows[0][0],
            saved_len=len(conversation),
            _written=dict(identical),
        )
