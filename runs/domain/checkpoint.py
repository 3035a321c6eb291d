"""The loop's working state and the full/delta checkpoint rule.

The state is the materialised form (the conversation itself); which event
holds each item is kept beside it (`backed_by`), so that the store can write
references instead of copies (runs.domain.stored_form)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from runs.domain.stored_form import NOT_GIVEN, RefRun, holds
from runs.domain.working_state import WorkingState
from runs.domain.writes import CheckpointInsert, EventWrite

FULL_EVERY = 8
FULL_TRIGGERS = frozenset({"compaction", "suspension", "final", "terminal", "seed", "approval_resolved"})


def is_full(version: int, trigger: str) -> bool:
    """Version 1, every eighth version, compaction, suspension and terminal are full."""
    return version == 1 or version % FULL_EVERY == 1 or trigger in FULL_TRIGGERS


class CallCounts(dict[str, int]):
    """Identical-call counts that remember which keys changed since the last
    checkpoint, so a delta costs what changed, not what the run has seen."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.changed: set[str] = set()

    def __setitem__(self, key: str, value: int) -> None:
        super().__setitem__(key, value)
        self.changed.add(key)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value


@dataclass
class CheckpointState:
    """What `CheckpointRepository.latest()` materialises and the loop works on."""

    conversation: list[dict[str, Any]] = field(default_factory=list)
    step: int = 0  # last step whose model response is in the conversation
    pending_tool_calls: list[dict[str, Any]] = field(default_factory=list)
    identical_calls: dict[str, int] = field(default_factory=CallCounts)
    denials: int = 0
    last_tool_error: str | None = None  # runtime carry (working_state.py)
    question_id: str | None = None  # runtime carry (working_state.py)
    version: int = 0
    last_full_version: int = 0
    saved_len: int = 0  # conversation items already persisted in the chain
    needs_full: bool = False  # rebuilt without a chain: the next write must be full
    # id(item) -> (item, the event that holds it: an EventWrite or a committed sequence)
    _sources: dict[int, tuple[dict[str, Any], Any]] = field(default_factory=dict, repr=False)
    # The stored form of the conversation's settled head (items whose event is
    # committed, or that no event holds), grown as full rows are written: the
    # list it describes, how many items it covers, its closed parts, its open run.
    _head: tuple[Any, int, list[Any], RefRun | None] = field(default=(None, 0, [], None), repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.identical_calls, CallCounts):
            self.identical_calls = CallCounts(self.identical_calls)

    def count_call(self, fingerprint: str) -> None:
        self.identical_calls[fingerprint] = self.identical_calls.get(fingerprint, 0) + 1

    def backed_by(self, item: dict[str, Any], source: Any) -> None:
        """`item` is held, exactly, by `source` (an `EventWrite` of a unit
        not yet committed, or a committed sequence): a checkpoint may name it."""
        self._sources[id(item)] = (item, source)

    def link(self, item: dict[str, Any], event: EventWrite | None, made_from: Any = NOT_GIVEN) -> None:
        """Note that `event` holds `item` when it reads back as exactly that
        item (`made_from`: the tool result the item was rendered from)."""
        if event is not None and holds(event, item, made_from):
            self.backed_by(item, event)

    def source_of(self, item: dict[str, Any]) -> Any:
        found = self._sources.get(id(item))
        return found[1] if found is not None and found[0] is item else None

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

    def next_is_full(self, trigger: str) -> bool:
        """Whether the next checkpoint with `trigger` will be a full row."""
        return self.needs_full or is_full(self.version + 1, trigger)

    def next_checkpoint(self, trigger: str, at: datetime, *, force_full: bool = False) -> CheckpointInsert:
        """Advance the version and return the row to write (full or delta)."""
        version = self.version + 1
        full = force_full or self.needs_full or is_full(version, trigger)
        self.needs_full = False
        state = self.scalars()
        counts = self.identical_calls
        if not isinstance(counts, CallCounts):  # replaced wholesale: every key counts as changed
            counts = self.identical_calls = CallCounts(counts)
        prefix: tuple[list[Any], int] | None = None
        if full:
            items = list(self.conversation)
            state["conversation"] = items
            state["identical_calls"] = dict(counts)
            base = None
            self.last_full_version = version
            prefix = self._settled_head()
            tail = items[prefix[1] :]
        else:
            # A delta carries only what changed since the previous version.
            tail = items = self.conversation[self.saved_len :]
            state["items"] = items
            state["identical_calls_changed"] = {k: counts[k] for k in counts.changed if k in counts}
            base = self.last_full_version
        counts.changed = set()
        self.version = version
        self.saved_len = len(self.conversation)
        return CheckpointInsert(
            version=version,
            full=full,
            base_version=base,
            trigger=trigger,
            state=state,
            created_at=at,
            sources=[self.source_of(i) for i in tail],
            prefix=prefix,
        )

    def _settled_head(self) -> tuple[list[Any], int]:
        """The stored form of the conversation up to its first item whose event
        is not committed yet, carried on from the previous full row: only the
        items added since are looked at (all of them once after a compaction
        or a rebuild, which start a new list)."""
        conversation = self.conversation
        described, covered, parts, run = self._head
        if described is not conversation or covered > len(conversation):
            described, covered, parts, run = conversation, 0, [], None
            self._sources = {id(i): self._sources[id(i)] for i in conversation if id(i) in self._sources}
        while covered < len(conversation):
            item = conversation[covered]
            source = self.source_of(item)
            seq = source if isinstance(source, int) else getattr(source, "sequence", None)
            if source is not None and seq is None:
                break  # its unit has not committed (this one, normally): the tail
            if seq is not None:
                if run is None:
                    run = RefRun(seq)
                else:
                    run.add(seq)
            else:
                if run is not None:
                    parts.append(run.text())
                    run = None
                parts.append(item)
            covered += 1
        self._head = (described, covered, parts, run)
        return parts + ([run.text()] if run is not None else []), covered

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
            identical_calls=CallCounts(identical),  # built whole: nothing counts as changed
            denials=last.get("denials", 0),
            last_tool_error=last.get("last_tool_error"),
            question_id=last.get("question_id"),
            version=last_version,
            last_full_version=rows[0][0],
            saved_len=len(conversation),
        )
