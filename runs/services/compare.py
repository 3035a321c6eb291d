"""Two runs side by side, step by step (a read: REST, the compare page and
`replay_runs` render it).

A step is what the run's log and rows hold for it: the model's text, the
tool calls it proposed with their arguments, how each ended (and whether it
was replayed from a record), and the usage and cost of its model attempts.
A fork's steps up to its fork point, and a replay's before its own first
one, are the original's (`inherited`): nothing ran there, so the comparison
shows what the run's conversation holds. Two steps are the same when they
made the same calls (tool and arguments) with the same results; the runs
diverge at the first step that differs or that only one of them has. The
model's text is compared too (`same_text`) but a different wording is not a
divergence: a replay against a real model rarely repeats it word for word.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from runs.domain.events import EventType
from runs.models import Event, ModelCall, Run, ToolInvocation
from runs.services.selectors import FAILURE_KEYS, USAGE_KEYS
from runs.store.lineage import lineage_chain, maker_of_step

STEP_USAGE = ("input_tokens", "output_tokens", "cache_read_input_tokens", "reasoning_tokens", "cost_usd")


def run_compare(*, a: Run, b: Run) -> dict[str, Any]:
    """The comparison of `a` and `b`: each run's summary, their steps side
    by side and the first step where they diverge (None: nowhere)."""
    left, right = run_steps(a), run_steps(b)
    steps = []
    diverged_at = None
    for number in range(1, max([0, *left, *right]) + 1):
        sa, sb = left.get(number), right.get(number)
        same_calls = sa is not None and sb is not None and _calls(sa) == _calls(sb)
        same_results = same_calls and _results(sa) == _results(sb)
        same = bool(same_calls and same_results)
        if not same and diverged_at is None:
            diverged_at = number
        steps.append(
            {
                "step": number,
                "a": sa,
                "b": sb,
                "same": same,
                "same_calls": same_calls,
                "same_text": sa is not None and sb is not None and sa["text"] == sb["text"],
            }
        )
    return {"a": _summary(a), "b": _summary(b), "steps": steps, "diverged_at": diverged_at}


def _calls(step: dict[str, Any] | None) -> list[tuple[Any, Any]]:
    return [(c["tool"], c["arguments"]) for c in (step or {}).get("calls", [])]


def _results(step: dict[str, Any] | None) -> list[tuple[Any, Any]]:
    return [(c["status"], c["result"]) for c in (step or {}).get("calls", [])]


def _summary(run: Run) -> dict[str, Any]:
    usage = run.usage or {}
    return {
        "id": str(run.id),
        "agent": run.agent.name,
        "agent_version": run.agent_version,
        "status": run.status,
        "failure": {k: run.failure.get(k) for k in (*FAILURE_KEYS, "details")} if run.failure else None,
        "final_message": run.final_message,
        "step_count": run.step_count,
        "usage": {k: usage.get(k, 0.0 if k == "cost_usd" else 0) for k in USAGE_KEYS},
        "forked_from": {"run": str(run.forked_from_id), "step": run.forked_from_step} if run.forked_from_id else None,
        "replay_of": str(run.replay_of_id) if run.replay_of_id else None,
    }


def run_steps(run: Run) -> dict[int, dict[str, Any]]:
    """The run's steps 1..step_count by number, each read from the run whose
    own step it is (a few queries per run of the lineage, not per step)."""
    chain = lineage_chain(run.id)
    makers: dict[Any, list[int]] = defaultdict(list)
    for number in range(1, (run.step_count or 0) + 1):
        makers[maker_of_step(run.id, number, chain)].append(number)
    steps: dict[int, dict[str, Any]] = {}
    for maker, numbers in makers.items():
        for number, step in _own_steps(maker, numbers).items():
            steps[number] = {**step, "run": str(maker), "inherited": maker != run.id}
    return steps


def _own_steps(run_id: Any, numbers: list[int]) -> dict[int, dict[str, Any]]:
    low, high = min(numbers), max(numbers)
    turns: dict[int, dict[str, Any]] = {}
    for payload in (
        Event.objects.filter(run_id=run_id, type=EventType.MODEL_RESPONSE_COMPLETED)
        .order_by("sequence")
        .values_list("payload", flat=True)
    ):
        if isinstance(payload, dict) and low <= (payload.get("step") or 0) <= high:
            turns.setdefault(payload["step"], payload)
    usage: dict[int, dict[str, Any]] = defaultdict(lambda: {k: 0 for k in STEP_USAGE} | {"attempts": 0})
    for number, spent in ModelCall.objects.filter(
        run_id=run_id, step_number__gte=low, step_number__lte=high
    ).values_list("step_number", "usage"):
        into = usage[number]
        into["attempts"] += 1
        for key in STEP_USAGE:
            into[key] += (spent or {}).get(key) or 0
    replayed = {
        str(p.get("invocation"))
        for p in Event.objects.filter(
            run_id=run_id, type__in=(EventType.TOOL_CALL_COMPLETED, EventType.TOOL_CALL_FAILED), payload__replayed=True
        ).values_list("payload", flat=True)
        if isinstance(p, dict)
    }
    calls: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in ToolInvocation.objects.filter(run_id=run_id, step_number__gte=low, step_number__lte=high).order_by(
        "step_number", "call_index"
    ):
        calls[row.step_number].append(
            {
                "tool": row.tool_name,
                "arguments": row.arguments if row.arguments is not None else row.raw_arguments,
                "status": row.status,
                "outcome": row.outcome,
                "result": row.result,
                "replayed": str(row.id) in replayed,
            }
        )
    out = {}
    for number in numbers:
        turn = turns.get(number)
        spent = dict(usage[number]) if number in usage else {k: 0 for k in STEP_USAGE} | {"attempts": 0}
        out[number] = {
            "text": turn.get("text") if turn else None,
            "proposed": [
                {"tool": c.get("name"), "arguments": c.get("arguments")} for c in (turn or {}).get("tool_calls") or []
            ],
            "calls": calls.get(number, []),
            "usage": spent,
            "completed": turn is not None,
        }
    return out


def replay_verdict(*, original: Run, replay: Run) -> dict[str, Any]:
    """How a replay of `original` ended, for `replay_runs`: `same` (it ended as
    the original did, with the same calls and results at every step),
    `diverged` (at `step`, with `why`: the divergence's reason, or `steps`
    when the two runs' steps differ though the replay ended without a
    divergence) or `failed` (it ended otherwise, `why` its failure reason or
    status: a model error, a budget, still running past the wait)."""
    failure = replay.failure or {}
    if replay.status not in ("COMPLETED", "FAILED", "CANCELLED"):
        return {"verdict": "failed", "step": None, "why": f"still {replay.status}"}
    if failure.get("reason") == "replay_diverged":
        details = failure.get("details") or {}
        return {"verdict": "diverged", "step": details.get("step"), "why": details.get("reason")}
    if replay.status == "CANCELLED" or (
        replay.status == "FAILED" and (original.failure or {}).get("reason") != failure.get("reason")
    ):
        return {"verdict": "failed", "step": failure.get("step_number"), "why": failure.get("reason") or "cancelled"}
    diverged_at = run_compare(a=original, b=replay)["diverged_at"]
    if diverged_at is not None or replay.status != original.status:
        return {"verdict": "diverged", "step": diverged_at, "why": "steps"}
    return {"verdict": "same", "step": None, "why": None}
