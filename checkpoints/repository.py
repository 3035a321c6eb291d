"""The checkpoint repository: read the chain back, and `seed_checkpoint`.

Writes happen inside the step's fenced transactions (runs/store/repository.py); this
module reads: `latest()` walks from the newest row back to the full snapshot
it rebases and materialises the conversation. `seed_checkpoint` rebuilds a
state from the session's history and this run's own event log; it is called
when the run is created and again whenever no usable checkpoint exists, so a
run whose checkpoints were all deleted still reaches the same end.
"""

from __future__ import annotations

import json

from django.db.models import Max

from checkpoints.models import Checkpoint
from runs.domain.checkpoint import CheckpointState

ANSWER_EVENTS = ("tool.call.completed", "tool.call.failed")


def checkpoint_latest(run_id) -> CheckpointState | None:
    newest = (
        Checkpoint.objects.filter(run_id=run_id)
        .order_by("-version")
        .values("version", "full", "base_version", "state")
        .first()
    )
    if newest is None:
        return None
    if newest["full"]:
        rows = [(newest["version"], True, newest["state"])]
    else:
        base = newest["base_version"]
        if base is None:
            return None
        rows = list(
            Checkpoint.objects.filter(run_id=run_id, version__gte=base, version__lte=newest["version"])
            .order_by("version")
            .values_list("version", "full", "state")
        )
    return CheckpointState.materialise(rows)


def session_history(run) -> list[dict]:
    """The conversation the session carried before this run: each earlier
    run's input and final answer."""
    from runs.models import Run

    items: list[dict] = []
    earlier = (
        Run.objects.filter(session_id=run.session_id, created_at__lt=run.created_at)
        .exclude(id=run.id)
        .order_by("created_at")
        .values_list("input", "final_message")
    )
    for text, answer in earlier:
        items.append({"role": "user", "content": text})
        if answer:
            items.append({"role": "assistant", "content": answer, "tool_calls": []})
    return items


def seed_state(run) -> CheckpointState:
    """Build the state from history and the run's committed log (no checkpoint)."""
    base = CheckpointState(conversation=session_history(run) + [{"role": "user", "content": run.input}], step=0)
    return catch_up(run, base, always=True)


def checkpoint_current(run) -> CheckpointState:
    """The state to continue from: the newest checkpoint, caught up with the
    log when it is older than the run's committed events, else seeded."""
    state = checkpoint_latest(run.id)
    return seed_state(run) if state is None else catch_up(run, state)


def catch_up(run, state: CheckpointState, *, always: bool = False) -> CheckpointState:
    """Bring a state read from a checkpoint older than the log up to the run's
    committed events (seed 002's stored form: the log is what checkpoints
    reference). Every model turn recorded after `state.step`
    (`model.response.completed` carries its calls) is appended, each earlier
    batch answered first from its invocation rows (the recorded results,
    including those written without a tool event: an operator's rejection,
    an interrupted observation, an answer to ask_user), else from the
    `tool.call.*` events. The last turn's batch is left open: the loop
    re-enters the pipeline for it, which answers recorded calls from their
    rows and never runs a call twice. The next write is a full snapshot
    numbered after every version the log has seen."""
    from runs.models import Event, ToolInvocation

    if not always and (run.step_count or 0) <= state.step:
        return state  # no model call was even started after the checkpoint's step
    turns: dict[int, dict] = {}
    for payload in (
        Event.objects.filter(run_id=run.id, type="model.response.completed")
        .order_by("sequence")
        .values_list("payload", flat=True)
    ):
        step = payload.get("step", 0) if isinstance(payload, dict) else 0
        if step > state.step and step not in turns:
            turns[step] = payload
    if not turns and not always:
        return state
    rows: dict[tuple[int, str], dict] = {}
    for row in ToolInvocation.objects.filter(run_id=run.id, step_number__gte=state.step).values(
        "step_number", "call_id", "status", "result", "arguments", "tool_name", "attempt"
    ):
        rows[(row["step_number"], row["call_id"])] = row
    logged: dict[str, tuple[str, dict]] = {}
    for type_, payload in (
        Event.objects.filter(run_id=run.id, type__in=ANSWER_EVENTS).order_by("sequence").values_list("type", "payload")
    ):
        if isinstance(payload, dict) and not payload.get("awaiting_decision"):  # an unknown outcome answers nothing
            logged.setdefault(payload.get("call_id"), (type_, payload))
    conversation = list(state.conversation)
    for step in sorted(turns):
        _answer_open_batch(conversation, state, state.step, rows, logged)
        payload = turns[step]
        conversation.append(
            {"role": "assistant", "content": payload.get("text"), "tool_calls": payload.get("tool_calls", [])}
        )
        state.step = step
    state.conversation = conversation
    state.needs_full = True
    top = Checkpoint.objects.filter(run_id=run.id).aggregate(v=Max("version"))["v"] or 0
    logged_versions = [
        v
        for v in Event.objects.filter(run_id=run.id, type="run.checkpointed").values_list("payload__version", flat=True)
        if isinstance(v, int)
    ]
    state.version = max([state.version, top, *logged_versions])
    return state


def _answer_open_batch(conversation: list[dict], state: CheckpointState, step: int, rows: dict, logged: dict) -> None:
    from runs.domain.pipeline import ANSWERED, _call_fingerprint

    for i in range(len(conversation) - 1, -1, -1):
        if conversation[i].get("role") == "assistant":
            calls = conversation[i].get("tool_calls") or []
            answered = {m.get("tool_call_id") for m in conversation[i + 1 :] if m.get("role") == "tool"}
            break
    else:
        return
    for call in calls:
        call_id = call.get("id")
        if call_id in answered:
            continue
        row = rows.get((step, call_id))
        if row is not None and row["status"] in ANSWERED and row["result"] is not None:
            result, is_error = row["result"], row["status"] != "completed"
            if (row["attempt"] or 0) >= 1 and isinstance(row["arguments"], dict):
                state.count_call(_call_fingerprint(row["tool_name"], row["arguments"]))
        elif call_id in logged:
            type_, payload = logged[call_id]
            result, is_error = payload.get("result"), type_ == "tool.call.failed"
        else:
            result, is_error = {"error": "interrupted", "message": "no outcome of this call was recorded"}, True
        conversation.append(
            {
                "role": "tool",
                "tool_call_id": call_id,
                "name": call.get("name"),
                "content": result if isinstance(result, str) else json.dumps(result, ensure_ascii=False),
                "is_error": is_error,
            }
        )
