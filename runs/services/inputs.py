"""The input service: deliver the user's answer to a run WAITING_FOR_USER
and requeue it, in one transaction."""

from __future__ import annotations

from django.db import transaction

from runs.clock import CLOCK
from runs.domain.pipeline.execute import TOOL_INPUT
from runs.domain.scrub import scrub_text
from runs.domain.writes import EventWrite
from runs.errors import InvalidInput, RunNotWaitingForUser
from runs.models import Run, ToolInvocation
from runs.runtime.enqueue import enqueue_drive
from runs.services.validation import check_text
from runs.store.events import record_events
from runs.tools.mcp.long import responses


def run_input(*, run: Run, text: str, by: str = "") -> Run:
    """Answer the run's pending question; the run goes back to QUEUED."""
    check_text(text, "text", max_length=100_000)
    text = scrub_text(text)  # the answer is persisted (invocation result, event, checkpoints): secrets never
    now = CLOCK.now()
    question = (
        ToolInvocation.objects.filter(
            run_id=run.id, status="awaiting_approval", suspended_kind__in=("user", TOOL_INPUT)
        )
        .order_by("-step_number")
        .first()
    )
    asked = _tool_question(question) if question is not None and question.suspended_kind == TOOL_INPUT else None
    if asked is not None:
        try:
            responses(asked[-1].get("remote") or {}, text)  # the answer must fit what the server asked
        except ValueError as exc:
            raise InvalidInput(
                f"the answer does not fit the question: it needs {exc}", fields={"text": [str(exc)]}
            ) from None
    with transaction.atomic(durable=True):
        requeued = Run.objects.filter(id=run.id, status__unindexed="WAITING_FOR_USER", lease_owner__isnull=True).update(
            status="QUEUED", updated_at=now
        )
        if requeued != 1:
            raise RunNotWaitingForUser("the run is not waiting for input")
        if asked is not None and question is not None:
            # A tool's question: the call is issued again with the answer (its attempt's entry keeps it).
            history, entry = asked
            entry["answer"] = text
            ToolInvocation.objects.filter(id=question.id, status="awaiting_approval").update(
                status="authorized", attempts=history, suspended_kind=None, updated_at=now
            )
        elif question is not None:
            ToolInvocation.objects.filter(id=question.id, status="awaiting_approval").update(
                status="completed", result={"answer": text}, suspended_kind=None, updated_at=now
            )
        record_events(
            tenant_id=run.tenant_id,
            session_id=run.session_id,
            run_id=run.id,
            epoch=run.lease_epoch,
            events=[
                EventWrite(
                    "run.input_received",
                    {"text": text[:4000], "by": by, "invocation": str(question.id) if question else None},
                    now,
                ),
                EventWrite("run.requeued", {"reason": "input"}, now),
            ],
        )
        enqueue_drive(run.id)
    return Run.objects.get(id=run.id)


def _tool_question(question: ToolInvocation) -> tuple[list[dict], dict] | None:
    """The call's attempt history and the entry of the attempt that asked (a tool's question)."""
    history = [dict(a) for a in (question.attempts or []) if isinstance(a, dict)]
    for entry in reversed(history):
        if entry.get("attempt") == question.attempt and entry.get("outcome") == "input_required":
            return history, entry
    return None
