"""Deliveries are written with the event they announce.

The store raises `EnqueueDeliveries` (runs.domain.writes) in the
transaction that appends events this module `wants`, once they are
inserted; its handler, registered by runs/runtime/wiring.py, calls
`enqueue`. So a
run's terminal transition, an approval requested or resolved, and a run
starting to wait for its user commit together with their deliveries and the
django-q2 tasks that ring them (the ORM broker writes its queue row on the
same connection): either all of it commits or none of it. Nothing is sent
here; `webhooks.delivery` sends, in its own task, after the commit.

Cost when nobody listens: a set lookup per event batch (no query); with
subscriptions, one SELECT of the tenant's active subscriptions per batch
that carries one of the six event types.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from uuid import UUID

from django.conf import settings
from django_q.tasks import async_task

from approvals.models import Approval
from approvals.selectors import approval_to_dict
from runs.clock import CLOCK, IDS
from runs.hooks import registered
from runs.models import Run, Tenant
from runs.services.selectors import run_to_dict
from runs.store.cursor import is_pg, sql_json

from .models import EVENT_TYPES, TERMINAL_EVENTS, Delivery, WebhookSubscription

WANTED = frozenset(EVENT_TYPES)
TASK = "webhooks.tasks.deliver"


def wants(events: Iterable) -> bool:
    return any(e.type in WANTED for e in events)


def ring(delivery_id) -> None:
    """Enqueue the delivery's doorbell; joins the caller's transaction (ORM broker)."""
    async_task(TASK, str(delivery_id), task_name=f"deliver {delivery_id}", ack_failure=True)


def enqueue(cursor, *, tenant_id: UUID, run_id: UUID | None, events: list, sequences: list[int]) -> int:
    """Write the deliveries the `events` ask for and ring them; return how many."""
    picked = [(e, seq) for e, seq in zip(events, sorted(sequences), strict=True) if e.type in WANTED]
    if not picked or run_id is None:
        return 0
    hooks = sorted(registered())
    subscriptions = list(
        WebhookSubscription.objects.filter(tenant_id=tenant_id, active=True).values("id", "event_types")
    )
    if not hooks and not subscriptions:
        return 0
    now = _db_now(cursor)
    rows: list[Delivery] = []
    context = None
    for event, seq in picked:
        if event.type in TERMINAL_EVENTS:
            rows += [
                Delivery(
                    id=IDS.new_id(),
                    tenant_id=tenant_id,
                    run_id=run_id,
                    kind="hook",
                    hook=name,
                    event_type=event.type,
                    event_sequence=seq,
                    due_at=now,
                    rung_at=now,
                    created_at=now,
                    updated_at=now,
                )
                for name in hooks
            ]
        targets = [s["id"] for s in subscriptions if event.type in (s["event_types"] or [])]
        if not targets:
            continue
        context = context or _context(tenant_id, run_id)
        for subscription_id in targets:
            delivery_id = IDS.new_id()
            rows.append(
                Delivery(
                    id=delivery_id,
                    tenant_id=tenant_id,
                    run_id=run_id,
                    kind="webhook",
                    subscription_id=subscription_id,
                    event_type=event.type,
                    event_sequence=seq,
                    payload=payload(delivery_id, event, seq, context),
                    due_at=now,
                    rung_at=now,
                    created_at=now,
                    updated_at=now,
                )
            )
    if not rows:
        return 0
    Delivery.objects.bulk_create(rows)
    for row in rows:
        ring(row.id)
    return len(rows)


def _db_now(cursor):
    if is_pg():
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]
    return CLOCK.now()


def _context(tenant_id, run_id) -> dict:
    run = Run.objects.select_related("agent").get(id=run_id)
    return {
        "tenant": Tenant.objects.filter(id=tenant_id).values_list("name", flat=True).first(),
        "run": run_to_dict(run),
    }


def links(run_id: str, approval_id: str | None = None) -> dict:
    base = settings.AGENTRT_PUBLIC_URL
    out = {"run": f"{base}/runs/{run_id}/", "api": f"{base}/api/runs/{run_id}/"}
    if approval_id:
        out.update(
            decide=f"{base}/runs/{run_id}/",
            approval=f"{base}/api/approvals/{approval_id}/",
            approve=f"{base}/api/approvals/{approval_id}/approve/",
            reject=f"{base}/api/approvals/{approval_id}/reject/",
        )
    return out


def payload(delivery_id, event, sequence: int, context: dict) -> dict:
    """The JSON body (README, "Webhooks"): fixed at the event's commit, the same on every attempt."""
    run = context["run"]
    data: dict = {"run": run, "event": {"sequence": sequence, "payload": json.loads(sql_json(event.payload) or "null")}}
    approval_id = None
    if event.type in ("approval.requested", "approval.resolved"):
        approval_id = str(event.payload.get("approval") or "") or None
        data["approval"] = _approval(approval_id, event.payload)
    return {
        "id": str(delivery_id),
        "type": event.type,
        "occurred_at": event.occurred_at.isoformat(),
        "tenant": context["tenant"],
        "data": data,
        "links": links(run["id"], approval_id if event.type == "approval.requested" else None),
    }


def _approval(approval_id: str | None, event_payload: dict) -> dict:
    """The approval in its REST shape, read in the event's own transaction."""
    row = Approval.objects.select_related("decided_by", "run").filter(id=approval_id).first() if approval_id else None
    if row is None:
        return {
            "id": approval_id,
            "kind": event_payload.get("kind"),
            "presentation": event_payload.get("presentation"),
            "request_hash": event_payload.get("request_hash"),
        }
    return approval_to_dict(row)
