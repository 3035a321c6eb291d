"""A run's lineage as the runtime reads it: where a fork or a replay takes its
start from, and the calls a run made at a step.

A fork's steps up to `forked_from_step` are the run it was forked from (they
were never run again); a replay's steps before its own first one are its
original's. So the calls "a run made at step s" are its own rows after that
point and, at or before it, those of the run it came from (and so on up)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from runs.domain.records import RecordedCall
from runs.models import Run, ToolInvocation

MAX_LINEAGE = 64  # how far up a lineage is followed (forks of forks of ...): a bound, never a cycle


@dataclass(frozen=True, slots=True)
class Base:
    """The run a fork or replay started from, and the last step taken from it."""

    run_id: UUID
    step: int


def _row(run_id: Any) -> tuple[Any, Any, Any] | None:
    row: tuple[Any, Any, Any] | None = (
        Run.objects.filter(id=run_id).values_list("forked_from_id", "forked_from_step", "replay_of_id").first()
    )
    return row


def lineage_chain(run_id: Any) -> list[tuple[Any, int]]:
    """`run_id` and the runs it came from, nearest first, each with the step
    after which its own steps start: [(run, start), ...]. Step s of `run_id`'s
    lineage is the own step of the first run in the chain whose start is
    below s. A fork starts at its step; a replay where its original does."""
    links: list[tuple[Any, int | None, Any]] = []  # (run, a fork's step or None, the run it came from)
    current = run_id
    for _ in range(MAX_LINEAGE):
        row = _row(current)
        if row is None:
            break
        forked_from, step, replay_of = row
        came_from = forked_from if forked_from is not None else replay_of
        links.append((current, (step or 0) if forked_from is not None else None, came_from))
        if came_from is None:
            break
        current = came_from
    chain: list[tuple[Any, int]] = []
    start = 0
    for run, fork_step, _ in reversed(links):  # a replay's start is its original's
        start = fork_step if fork_step is not None else start
        chain.append((run, start))
    chain.reverse()
    return chain or [(run_id, 0)]


def own_start(run_id: Any) -> int:
    """The step after which `run_id`'s own steps start: a fork's step, a
    replay's original's own start, else 0."""
    return lineage_chain(run_id)[0][1]


def lineage_base(run: Run) -> Base | None:
    """Where `run` took its start from (None: a run submitted afresh, or one
    whose original is gone)."""
    if run.forked_from_id is not None:
        return Base(run.forked_from_id, run.forked_from_step or 0)
    if run.replay_of_id is not None:
        return Base(run.replay_of_id, own_start(run.replay_of_id))
    return None


def maker_of_step(run_id: Any, step: int, chain: list[tuple[Any, int]] | None = None) -> Any:
    """The run whose own step `step` is, seen from `run_id`'s lineage."""
    chain = chain if chain is not None else lineage_chain(run_id)
    return next((run for run, start in chain if step > start), chain[-1][0])


def recorded_calls(run_id: Any, step: int) -> list[RecordedCall]:
    """The calls made at step `step` of `run_id`'s lineage, in call order."""
    maker = maker_of_step(run_id, step)
    rows = ToolInvocation.objects.filter(run_id=maker, step_number=step).order_by("call_index")
    return [
        RecordedCall(
            run_id=r.run_id,
            invocation_id=r.id,
            step_number=r.step_number,
            call_index=r.call_index,
            tool_name=r.tool_name,
            arguments=r.arguments if isinstance(r.arguments, dict) else None,
            raw_arguments=r.raw_arguments or "",
            status=r.status,
            result=r.result,
            outcome=r.outcome,
            started=r.effect_sent_at is not None,
        )
        for r in rows
    ]


class RecordedCallsReader:
    """The `runs.domain.ports.RecordedCalls` adapter: the calls of one run's
    lineage (the run a replay replays), read a step at a time."""

    def __init__(self, run_id: Any):
        self.run_id = run_id

    def at_step(self, step_number: int) -> list[RecordedCall]:
        return recorded_calls(self.run_id, step_number)
