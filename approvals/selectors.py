"""Reads of approvals for the operator's surfaces: the inbox of the ones waiting
for a decision (oldest first), its count in the live pages' header, and the
card a person sees before deciding (the pages and `manage.py approvals`).

Every read starts from runs.services.scoping: the inbox holds the approvals
the user may decide (its own tenant's); a superuser may look at another
tenant's, read-only, by naming it."""

from __future__ import annotations

import json
from typing import Any

from django.db.models import QuerySet

from approvals.models import Approval
from approvals.unknown import deadline_passed, decisions_open, ends_run
from runs.clock import CLOCK
from runs.services import scoping

INBOX_LIMIT = 200
ARGUMENTS_PREVIEW = 200


def approvals_waiting(*, user, tenant: str | None = None) -> QuerySet:
    """Pending approvals, oldest first: those `user` may decide, or — with
    `tenant` — those of the tenant of that name that `user` may see."""
    if tenant:
        qs = scoping.tenant_named(scoping.approvals_visible_to(user), tenant).select_related("run__agent")
    else:
        qs = scoping.approvals_actionable_by(user)
    return qs.filter(status="pending").order_by("created_at", "id")


def waiting_count(*, user) -> int:
    """How many approvals wait for a decision `user` may make (the header's "3 waiting")."""
    return scoping.approvals_actionable_by(user).filter(status="pending").count()


def _iso(dt) -> str | None:
    return dt.isoformat().replace("+00:00", "Z") if dt else None


def approval_to_dict(approval: Approval) -> dict[str, Any]:
    """An approval in its REST shape (runs.api.serializers.ApprovalOut documents its fields): what the REST
    API answers and what a webhook's `approval.*` payload carries, one function so the two cannot drift."""
    run = approval.run
    now = CLOCK.now()
    return {
        "id": str(approval.id),
        "run": str(approval.run_id),
        "invocation": str(approval.invocation_id) if approval.invocation_id else None,
        "kind": approval.kind,
        "status": approval.status,
        "request_hash": approval.request_hash,
        "presentation": approval.presentation,
        "expires_at": _iso(approval.expires_at),
        "deadline_passed": deadline_passed(run, now),
        "decisions": decisions_open(approval, run, now),
        "ends_run": ends_run(approval, run, now),
        "decided_by": approval.decided_by.get_username() if approval.decided_by_id else None,
        "decided_at": _iso(approval.decided_at),
        "decided_via": approval.decided_via,
        "reason": approval.reason,
        "created_at": _iso(approval.created_at),
    }


def approval_card(approval: Approval, *, with_tenant: bool = False) -> dict[str, Any]:
    """What a person is shown of one approval before deciding it (plain data: pages set it as text): the
    REST shape (ApprovalOut's fields) and, beside it, the run's agent and status and the card's parts."""
    run = approval.run
    now = CLOCK.now()
    presentation = approval.presentation if isinstance(approval.presentation, dict) else {}
    arguments = presentation.get("arguments")
    preview = json.dumps(arguments, ensure_ascii=False, sort_keys=True) if arguments is not None else ""
    card = {
        "id": str(approval.id),
        "run": str(approval.run_id),
        "invocation": str(approval.invocation_id) if approval.invocation_id else None,
        "run_short": str(approval.run_id).replace("-", "")[-8:],
        "agent": run.agent.name,
        "run_status": run.status,
        "kind": approval.kind,
        "status": approval.status,
        "tool": presentation.get("tool") or "",
        "side_effect": presentation.get("side_effect") or "",
        "notice": presentation.get("notice") or "",
        "presentation": presentation,
        "arguments": arguments,
        "arguments_preview": preview[:ARGUMENTS_PREVIEW] + ("…" if len(preview) > ARGUMENTS_PREVIEW else ""),
        "request_hash": approval.request_hash,
        "created_at": _iso(approval.created_at),
        "expires_at": _iso(approval.expires_at),
        "deadline_passed": deadline_passed(run, now),
        "decisions": decisions_open(approval, run, now),
        "ends_run": ends_run(approval, run, now),
        "decided_by": approval.decided_by.get_username() if approval.decided_by_id else None,
        "decided_at": _iso(approval.decided_at),
        "decided_via": approval.decided_via,
        "reason": approval.reason,
    }
    if with_tenant:
        card["tenant"] = run.tenant.name
    return card
