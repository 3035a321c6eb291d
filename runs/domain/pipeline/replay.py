"""A replay's tool calls: answered from the original's record, never executed.

A replay calls the model for real. Each call its model proposes is set
against the call the original made at the same position (step, place in the
batch), read through the `RecordedCalls` port: the same tool with the same
arguments gets the original's recorded result — its row written with
`attempt` 0, its `tool.call.completed` / `tool.call.failed` saying
`replayed: true`, `executed: false` and the original's invocation — and the
run goes on. Anything else ends the run `replay_diverged` (`ReplayDiverged`,
the position and both calls in its details): another tool, other arguments,
a call where the original made none, none where it made one (a batch with a
call missing, or a final answer where the original called a tool). The same
call whose outcome the original never learned (uncertain, interrupted) ends
it too, with the reason `outcome_unknown`; one that never got a result (it
still waited for a person) with `no_recorded_result`.

Read-only calls are replayed like side effects, not run again: a replay
reaches nothing but the model, and its model sees exactly what the original's
saw, so a difference it shows is the version's, not the world's since then.
Policy, approvals and budgets of calls are not asked: nothing runs, and the
original's record already holds what they decided (a denial is replayed as a
denial). Replayed calls are counted for the loop guard as in the original.
"""

from __future__ import annotations

from typing import Any

from runs.domain import events
from runs.domain.context import RunContext
from runs.domain.errors import ReplayDiverged
from runs.domain.events import EventType
from runs.domain.pipeline.batch import (
    ANSWERED,
    BatchResult,
    _all_denied,
    _append_results,
    _call_fingerprint,
    _Entry,
    _error_codes,
    _fail,
    _insert_row,
    _record_proposal,
)
from runs.domain.records import RecordedCall
from runs.domain.scrub import scrub_text
from runs.domain.values import InvocationOutcome, InvocationStatus
from runs.domain.writes import UnitOfWork

UNKNOWN = (InvocationStatus.UNCERTAIN, InvocationStatus.INTERRUPTED)


def replay_batch(ctx: RunContext, step_number: int, entries: list[_Entry], work: UnitOfWork) -> BatchResult:
    """The replay's steps 1–14 for a resolved batch: each call answered from
    the original's record, committed with the model response (`work`); or
    the batch recorded as not run and `ReplayDiverged` raised."""
    assert ctx.replay is not None  # only a replay's pipeline comes here
    recorded = {c.call_index: c for c in ctx.replay.at_step(step_number)}
    now = ctx.clock.now()
    divergence = _divergence(step_number, entries, recorded)
    for entry in entries:
        tool_name = _record_proposal(work, entry, step_number, now)
        if divergence is not None:
            _fail(entry, "replay_diverged", divergence["message"])  # recorded as not run, like a refused call
            work.invocation_inserts.append(
                _insert_row(
                    entry,
                    step_number,
                    tool_name,
                    now,
                    InvocationStatus.FAILED,
                    result=entry.result,
                    error=entry.result,
                    outcome=InvocationOutcome.FAILED,
                )
            )
            work.events.append(
                events.call_not_run(
                    invocation_id=entry.invocation_id,
                    call_id=entry.call.call_id,
                    tool=tool_name,
                    result=entry.result,
                    at=now,
                    outcome=InvocationOutcome.FAILED,
                )
            )
            continue
        original = recorded[entry.index]
        entry.result, entry.is_error = original.result, original.status != InvocationStatus.COMPLETED
        status = InvocationStatus.FAILED if entry.is_error else InvocationStatus.COMPLETED
        work.invocation_inserts.append(
            _insert_row(
                entry,
                step_number,
                tool_name,
                now,
                status,
                result=entry.result,
                error=entry.result if entry.is_error else None,
                outcome=original.outcome,
            )
        )
        entry.event = work.event(
            EventType.TOOL_CALL_FAILED if entry.is_error else EventType.TOOL_CALL_COMPLETED,
            {
                "invocation": str(entry.invocation_id),
                "call_id": entry.call.call_id,
                "tool": tool_name,
                "result": entry.result,
                "executed": False,
                "replayed": True,
                "original_invocation": str(original.invocation_id),
                "outcome": original.outcome,
            },
            now,
        )
    ctx.store.commit(work)  # the model response, every proposal and its replayed answer: one commit
    if divergence is not None:
        raise ReplayDiverged(divergence.pop("message"), **divergence)
    _append_results(ctx, entries)
    for entry in entries:
        ctx.state.count_call(_call_fingerprint(entry.call.name, entry.arguments))
    return BatchResult(work=UnitOfWork(), all_denied=_all_denied(entries), error_codes=_error_codes(entries))


def replay_final(ctx: RunContext, step_number: int) -> None:
    """A replay's turn without calls (its final answer): it diverges when the
    original called a tool at that step."""
    assert ctx.replay is not None
    recorded = ctx.replay.at_step(step_number)
    if recorded:
        divergence = _diverged("call_missing", step_number, 0, recorded[0], None)
        raise ReplayDiverged(divergence.pop("message"), **divergence)


def _divergence(step_number: int, entries: list[_Entry], recorded: dict[int, RecordedCall]) -> dict[str, Any] | None:
    """The first position where the batch departs from the original's, or None."""
    for index in range(max(len(entries), max(recorded, default=-1) + 1)):
        entry = entries[index] if index < len(entries) else None
        original = recorded.get(index)
        if original is None:
            return _diverged("no_call_recorded", step_number, index, None, entry)
        if entry is None:
            return _diverged("call_missing", step_number, index, original, None)
        if not _same_call(entry, original):
            return _diverged("different_call", step_number, index, original, entry)
        if original.status not in ANSWERED or original.result is None:
            unknown = original.status in UNKNOWN or original.started or original.outcome == InvocationOutcome.UNCERTAIN
            reason = "outcome_unknown" if unknown else "no_recorded_result"
            return _diverged(reason, step_number, index, original, entry)
    return None


def _same_call(entry: _Entry, original: RecordedCall) -> bool:
    if scrub_text(entry.call.name)[:200] != original.tool_name:
        return False
    if entry.arguments is not None or original.arguments is not None:
        return bool(entry.arguments == original.arguments)
    return scrub_text(entry.call.raw_arguments or "") == original.raw_arguments


REASONS = {
    "different_call": "proposed another call than the original made there",
    "no_call_recorded": "proposed a call where the original made none",
    "call_missing": "made no call where the original made one",
    "outcome_unknown": "reached a call whose outcome the original never learned",
    "no_recorded_result": "reached a call the original never got a result for",
}


def _diverged(
    reason: str, step_number: int, index: int, original: RecordedCall | None, entry: _Entry | None
) -> dict[str, Any]:
    return {
        "message": f"the replay diverged at step {step_number}, call {index + 1}: it {REASONS[reason]}",
        "reason": reason,
        "step": step_number,
        "call_index": index,
        "original": None
        if original is None
        else {
            "run": str(original.run_id),
            "invocation": str(original.invocation_id),
            "tool": original.tool_name,
            "arguments": original.arguments if original.arguments is not None else original.raw_arguments,
            "status": original.status,
            "outcome": original.outcome,
        },
        "replayed": None
        if entry is None
        else {
            "tool": scrub_text(entry.call.name)[:200],
            "arguments": entry.arguments
            if entry.arguments is not None
            else scrub_text(entry.call.raw_arguments or "")[:4096],
        },
    }
