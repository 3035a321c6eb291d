"""The stored form of a checkpoint: conversation items as references
to the events that already hold them.

"Conversation is what the repository returns; event references and deltas are
what it persists." A model turn is in its `model.response.completed` event, a
tool result in its `tool.call.completed` / `tool.call.failed` event; a
checkpoint row names those events by their session sequence instead of
copying them, and keeps inline only what no event holds exactly (the run's
input and the session's history, summaries, interrupted observations,
answers a person gave, anything whose event was never committed).

The conversation the loop sees is built by the functions below from either
side — the live code builds an item with `assistant_item` / `tool_item`, the
repository builds the same item from the event with `item_from_event` — so
a reference materialises to exactly the item it replaced. An item is linked
to its event (`CheckpointState.backed_by`) only when that holds; the round
trip is tested on recorded runs (tests/integration/test_stored_form.py).

On disk (`form` 2), `conversation` (full rows) and `items` (deltas) are lists
of parts, in conversation order:

- a dict with a `role`: an inline item;
- a string: consecutive items referenced by sequence — the first sequence,
  then the gap to each next one, a repeated group of gaps written once with
  its count (`"812 4 3.4*37"`: 812, 816, then 819, 823 thirty-seven times
  over), so the references of a run whose steps look alike stay a few bytes
  however long it gets;
- `{"u": [k, ...]}`: the k-th events of the row's own unit of work, whose
  sequences the database hands out in the statement that writes the row; a
  row written with events records the sequence before the first as
  `events_from` (whether it names them or not);
- `{"p": [k, ...]}`: the k-th events of the unit just before the row's own,
  still in flight when the row was built (a step's commit 2, sent behind its
  commit 1); the statement copies that unit's `events_from` from its
  checkpoint row into this row as `prior_from`.

Identical-call counts are not stored: the repository counts them from the
invocation rows (a call that ran), so a full row does not grow with every
distinct call a run makes.
"""

from __future__ import annotations

import json
from typing import Any

from runs.domain.writes import CheckpointInsert, EventWrite

FORM = 2
TURN_EVENT = "model.response.completed"
RESULT_EVENTS = ("tool.call.completed", "tool.call.failed")
MAX_GROUP = 8  # the longest group of gaps written once with a count
_NOT_STORED = ("identical_calls", "identical_calls_changed")


# -- one item, built the same way from the live turn and from its event ----


def assistant_item(text: str | None, tool_calls: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": text,
        "tool_calls": [{"id": c.get("id"), "name": c.get("name"), "arguments": c.get("arguments")} for c in tool_calls],
    }


def tool_content(result: Any) -> str:
    """What the model reads for a tool result: text as it is, anything else as
    JSON with sorted keys (the events table keeps JSON objects without their
    key order, so only a sorted rendering reads back the same)."""
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, sort_keys=True)


def tool_item(call_id: str | None, name: str | None, result: Any, is_error: bool) -> dict[str, Any]:
    return {
        "role": "tool",
        "tool_call_id": call_id,
        "name": name,
        "content": tool_content(result),
        "is_error": is_error,
    }


def item_from_event(type_: str, payload: Any) -> dict[str, Any] | None:
    """The conversation item an event holds, or None."""
    if not isinstance(payload, dict):
        return None
    if type_ == TURN_EVENT:
        return assistant_item(payload.get("text"), payload.get("tool_calls") or [])
    if type_ in RESULT_EVENTS and not payload.get("awaiting_decision"):
        return tool_item(payload.get("call_id"), payload.get("tool"), payload.get("result"), type_ != RESULT_EVENTS[0])
    return None


NOT_GIVEN: Any = object()


def holds(event: EventWrite, item: dict[str, Any], made_from: Any = NOT_GIVEN) -> bool:
    """Whether `event` reads back as exactly `item` (checked before linking).
    `made_from`: the result a tool item was rendered from; when the event
    holds that very object, the item's text need not be rendered again."""
    payload = event.payload
    if item.get("role") == "assistant":
        return (
            event.type == TURN_EVENT
            and payload.get("text") == item.get("content")
            and payload.get("tool_calls") == item.get("tool_calls")
        )
    if item.get("role") != "tool" or event.type not in RESULT_EVENTS or payload.get("awaiting_decision"):
        return False
    result = payload.get("result")
    return (
        payload.get("call_id") == item.get("tool_call_id")
        and payload.get("tool") == item.get("name")
        and (event.type != RESULT_EVENTS[0]) == bool(item.get("is_error"))
        and _json_stable(result)
        and (result is made_from or tool_content(result) == item.get("content"))
    )


def _json_stable(value: Any) -> bool:
    """JSON that reads back from jsonb as the same Python value: string keys,
    no float written with an exponent (jsonb prints 1e+16 as an integer)."""
    if isinstance(value, str | bool | int) or value is None:
        return True
    if isinstance(value, float):
        text = repr(value)
        return "e" not in text and "n" not in text and text != "-0.0"
    if isinstance(value, list):
        return all(_json_stable(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_stable(v) for k, v in value.items())
    return False


# -- references: a compact list of sequences -------------------------------


def encode_refs(seqs: list[int]) -> str:
    tokens = [str(seqs[0])]
    gaps = [b - a for a, b in zip(seqs, seqs[1:], strict=False)]
    i, n = 0, len(gaps)
    while i < n:
        best_p, best_r = 1, 1
        for p in range(1, min(MAX_GROUP, (n - i) // 2) + 1):
            j = i + p  # how far the gaps keep repeating the group that starts at i
            while j < n and gaps[j] == gaps[j - p]:
                j += 1
            r = (j - i) // p
            if r >= 2 and p * r > best_p * best_r:
                best_p, best_r = p, r
        group = gaps[i : i + best_p]
        if best_r >= 2:
            tokens.append(".".join(map(str, group)) + f"*{best_r}")
        else:
            tokens.append(str(group[0]))
        i += best_p * best_r
    return " ".join(tokens)


class RefRun:
    """A run of references built one sequence at a time: what a full row
    repeats of the conversation it already wrote costs nothing to encode
    again, so a step's Python does not grow with the run. Its text decodes
    like `encode_refs`' (the groups it finds may differ)."""

    def __init__(self, first: int) -> None:
        self.first = self.last = first
        self.tokens: list[str] = []  # settled
        self.pending: list[int] = []  # gaps not settled yet (at most 2 * MAX_GROUP)
        self.group: tuple[int, ...] | None = None  # the group being repeated
        self.count = 0  # its whole repeats so far
        self.pos = 0  # how far into the next repeat

    def add(self, seq: int) -> None:
        gap, self.last = seq - self.last, seq
        if self.group is not None:
            if gap == self.group[self.pos]:
                self.pos += 1
                if self.pos == len(self.group):
                    self.count, self.pos = self.count + 1, 0
                return
            self.tokens.append(".".join(map(str, self.group)) + f"*{self.count}")
            self.pending, self.group, self.pos = list(self.group[: self.pos]), None, 0
        self.pending.append(gap)
        n = len(self.pending)
        for p in range(1, min(MAX_GROUP, n // 2) + 1):
            if self.pending[n - 2 * p : n - p] == self.pending[n - p :]:
                self.tokens.extend(map(str, self.pending[: n - 2 * p]))
                self.group, self.count, self.pending = tuple(self.pending[n - p :]), 2, []
                return
        if n > 2 * MAX_GROUP:
            self.tokens.append(str(self.pending.pop(0)))

    def text(self) -> str:
        parts = [str(self.first), *self.tokens]
        if self.group is not None:
            parts.append(".".join(map(str, self.group)) + f"*{self.count}")
            parts.extend(map(str, self.group[: self.pos]))
        parts.extend(map(str, self.pending))
        return " ".join(parts)


def decode_refs(text: str) -> list[int]:
    tokens = text.split()
    current = int(tokens[0])
    seqs = [current]
    for token in tokens[1:]:
        group, _, count = token.partition("*")
        gaps = [int(g) for g in group.split(".")]
        for _ in range(int(count) if count else 1):
            for gap in gaps:
                current += gap
                seqs.append(current)
    return seqs


# -- a row: materialised form -> stored form --------------------------------


def encode(
    row: CheckpointInsert, unit_events: list[EventWrite], prior_events: list[EventWrite] | None = None
) -> dict[str, Any]:
    """The stored form of `row`, written in the unit whose events are
    `unit_events` (named `{"u": ...}`; the writer adds `events_from`).
    `prior_events`: the events of the unit sent just before this one and not
    answered yet (named `{"p": ...}`; the writer then adds `prior_from`, see
    `names_prior`). `row.prefix` is the stored form of the items a full row
    starts with (`CheckpointState` keeps it up to date); `row.sources` run
    beside the items after them. Items whose event is neither committed nor
    in either unit stay inline."""
    key = "conversation" if "conversation" in row.state else "items"
    head, covered = row.prefix if row.prefix is not None else ([], 0)
    items = (row.state.get(key) or [])[covered:]
    sources = row.sources if row.sources is not None else [None] * len(items)
    ordinals = {id(e): ("u", k) for k, e in enumerate(unit_events, start=1)}
    ordinals.update({id(e): ("p", k) for k, e in enumerate(prior_events or (), start=1)})
    parts: list[Any] = list(head)
    run: list[int] = []  # committed sequences not yet written as a part
    unit: tuple[str, list[int]] | None = None  # ("u" or "p", ordinals) not yet written as a part

    def end_run() -> None:
        nonlocal run
        if run:
            parts.append(encode_refs(run))
            run = []

    def end_unit(unless: str | None = None) -> None:
        nonlocal unit
        if unit is not None and unit[0] != unless:
            parts.append({unit[0]: unit[1]})
            unit = None

    for item, source in zip(items, sources, strict=True):
        seq = source if isinstance(source, int) else getattr(source, "sequence", None)
        ordinal = ordinals.get(id(source)) if seq is None and source is not None else None
        if seq is not None:
            end_unit()
            run.append(seq)
        elif ordinal is not None:
            end_run()
            end_unit(unless=ordinal[0])
            if unit is None:
                unit = (ordinal[0], [])
            unit[1].append(ordinal[1])
        else:
            end_run()
            end_unit()
            parts.append(item)
    end_run()
    end_unit()
    stored = {k: v for k, v in row.state.items() if k not in _NOT_STORED and k != key}
    stored["form"] = FORM
    stored[key] = parts
    return stored


def names_prior(stored: dict[str, Any]) -> bool:
    """Whether a stored row names events of the unit before its own (`{"p": ...}`)."""
    parts = stored.get("conversation", stored.get("items")) or []
    return any(isinstance(p, dict) and "p" in p and "role" not in p for p in parts)


def _unit_part(part: dict[str, Any], state: dict[str, Any]) -> list[int] | None:
    """The sequences a `{"u": ...}` or `{"p": ...}` part names (None: unreadable)."""
    for key, base_key in (("u", "events_from"), ("p", "prior_from")):
        if key in part:
            base = state.get(base_key)
            if not isinstance(base, int) or isinstance(base, bool):
                return None
            return [base + k for k in part[key]]
    return None


# -- a row: stored form -> materialised form ---------------------------------


def is_stored(state: Any) -> bool:
    return isinstance(state, dict) and state.get("form") == FORM


def referenced(state: dict[str, Any]) -> list[int]:
    """Every sequence a stored row names."""
    seqs: list[int] = []
    for part in state.get("conversation", state.get("items")) or []:
        if isinstance(part, str):
            seqs.extend(decode_refs(part))
        elif isinstance(part, dict) and "role" not in part:
            seqs.extend(_unit_part(part, state) or [])
    return seqs


def materialised(
    state: dict[str, Any], events: dict[int, tuple[str, Any]]
) -> tuple[dict[str, Any], list[tuple[dict[str, Any], int]]] | None:
    """The materialised form of a stored row, given the events it names
    (sequence -> (type, payload)), and each referenced item with its sequence;
    None when a named event is missing or holds no item (the chain is then
    unusable and the repository rebuilds from the log)."""
    key = "conversation" if "conversation" in state else "items"
    items: list[dict[str, Any]] = []
    linked: list[tuple[dict[str, Any], int]] = []
    for part in state.get(key) or []:
        if isinstance(part, dict) and "role" in part:
            items.append(part)
            continue
        if isinstance(part, str):
            seqs = decode_refs(part)
        elif isinstance(part, dict) and (named := _unit_part(part, state)) is not None:
            seqs = named
        else:
            return None
        for seq in seqs:
            found = events.get(seq)
            item = item_from_event(*found) if found is not None else None
            if item is None:
                return None
            items.append(item)
            linked.append((item, seq))
    plain = {k: v for k, v in state.items() if k not in ("form", "events_from", "prior_from", key)}
    plain[key] = items
    return plain, linked
