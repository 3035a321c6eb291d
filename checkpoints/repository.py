"""The checkpoint repository: read the chain back, and `seed_checkpoint`.

Writes happen inside the step's fenced transactions (runs/store.py); this
module reads: `latest()` walks from the newest row back to the full snapshot
it rebases and materialises the conversation. `seed_checkpoint` rebuilds a
state from the session's history and this run's own event log; it is called
when the run is created and again whenever no usable checkpoint exists, so a
run whose checkpoints were all deleted still reaches the same end.
"""
from __future__ import annotations

import json

from django.db.models import Max

from runs.domain.checkpoint import CheckpointState

from .models import Checkpoint

ANSWER_EVENTS = ("tool.call.completed", "tool.call.failed")


def checkpoint_latest(run_id) -> CheckpointState | None:
    newest = Checkpoint.objects.filter(run_id=run_id).order_by("-version").values("version", "full", "base_version", "state").first()
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
    """Build the state from history and the run's committed events."""
    from runs.models import Event

    conversation = session_history(run) + [{"role": "user", "content": run.input}]
    step = 0
    events = Event.objects.filter(run_id=run.id, type__in=("model.response.completed",) + ANSWER_EVENTS).order_by("sequence").values_list("type", "payload")
    answered: set[str] = set()
    for type_, payload in events:
        if type_ == "model.response.completed":
            step = max(step, payload.get("step", 0))
            conversation.append({"role": "assistant", "content": payload.get("text"), "tool_calls": payload.get("tool_calls", [])})
        else:
            call_id = payload.get("call_id")
            if call_id in answered:
                continue
            answered.add(call_id)
            result = payload.get("result")
            conversation.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "name": payload.get("tool"),
                    "content": result if isinstance(result, str) else json.dumps(result, ensure_ascii=False),
                    "is_error": type_ == "tool.call.failed",
                }
            )
    top = Checkpoint.objects.filter(run_id=run.id).aggregate(v=Max("version"))["v"] or 0
    return CheckpointState(conversation=conversation, step=step, version=top, saved_len=0, needs_full=True)
