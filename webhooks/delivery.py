"""Performing one delivery: claim, send (or call the hook), record.

    claim   UPDATE ... SET attempts = attempts + 1, due_at = now + CLAIM
            WHERE id = ? AND status = 'pending' AND due_at <= now
    send    no transaction open; the webhook POST or the hook call
    record  succeeded; or due again after backoff; or failed (too old / refused)

The claim is one guarded UPDATE, so two workers never hold one delivery at
once; a worker killed after it leaves the delivery due again when the claim
lapses (AGENTRT_DELIVERY_CLAIM_SECONDS, longer than the webhook timeout),
and the maintenance sweep rings it again. At least once, under one delivery
id: a receiver that dedupes on `X-Agentrt-Delivery` sees each event once.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.db.models import F

from runs.domain.scrub import scrub_text
from runs.hooks import RunView, registered
from runs.models import Run
from runs.runtime.faults import fire
from runs.runtime.queue import db_now
from runs.services.selectors import run_to_dict

from . import outbound
from .models import Delivery
from .secrets import SecretUnreadable, decrypt

log = logging.getLogger("agentrt.webhooks")
MAX_ERROR = 2000
CANCELLED = "cancelled"  # "do not retry, and the delivery ends cancelled": its subscription is gone or inactive
BACKOFF_CAP_SECONDS = 6 * 3600


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def backoff(attempts: int) -> float:
    """Seconds before attempt `attempts + 1`: base × 2^(attempts-1), at most 6 h apart."""
    base = float(settings.AGENTRT_DELIVERY_BACKOFF_SECONDS)
    return min(base * (2 ** max(0, attempts - 1)), BACKOFF_CAP_SECONDS)


def claim(delivery_id) -> Delivery | None:
    now = db_now()
    taken = Delivery.objects.filter(id=delivery_id, status="pending", due_at__lte=now).update(
        attempts=F("attempts") + 1,
        due_at=now + timedelta(seconds=float(settings.AGENTRT_DELIVERY_CLAIM_SECONDS)),
        claimed_by=worker_name(),
        claimed_at=now,
        updated_at=now,
    )
    if taken != 1:
        return None
    return Delivery.objects.select_related("subscription", "tenant").get(id=delivery_id)


def deliver(delivery_id) -> str:
    """The body of the `webhooks.tasks.deliver` doorbell."""
    if connection.in_atomic_block:
        raise RuntimeError("a delivery runs outside any database transaction")
    row = claim(delivery_id)
    if row is None:
        return "not_claimed"
    try:
        if row.kind == "hook":
            ok, error, status, retry = _call_hook(row)
        else:
            ok, error, status, retry = _send(row)
    except Exception as exc:  # a hook's or a sender's failure is the delivery's, never the run's
        log.warning("delivery %s (%s) raised %s", row.id, row.hook or row.event_type, type(exc).__name__)
        ok, error, status, retry = False, f"{type(exc).__name__}: {scrub_text(str(exc))}", None, True
    if row.kind == "webhook":
        fire("webhook.after_send", row.id)  # test builds only: sent and answered, the outcome not yet recorded
    return record(
        row,
        ok=ok,
        error=error,
        status=status,
        retry=retry is True,
        final="cancelled" if retry == CANCELLED else "failed",
    )


def record(
    row: Delivery, *, ok: bool, error: str = "", status: int | None = None, retry: bool = True, final: str = "failed"
) -> str:
    now = db_now()
    error = (error or "")[:MAX_ERROR]
    if ok:
        Delivery.objects.filter(id=row.id, status="pending").update(
            status="succeeded", delivered_at=now, last_error="", last_status_code=status, updated_at=now
        )
        return "succeeded"
    mine = Delivery.objects.filter(
        id=row.id, status="pending", attempts=row.attempts
    )  # a later claim's attempt records its own
    next_at = now + timedelta(seconds=backoff(row.attempts))
    too_old = next_at > row.created_at + timedelta(seconds=float(settings.AGENTRT_DELIVERY_MAX_AGE_SECONDS))
    if not retry or too_old:
        mine.update(status=final, last_error=error, last_status_code=status, updated_at=now)
        return final
    mine.update(due_at=next_at, last_error=error, last_status_code=status, updated_at=now)
    return "retry"


def _call_hook(row: Delivery):
    fn = registered().get(row.hook)
    if fn is None:  # a node without it (a deploy in progress): retried, then failed
        return (
            False,
            f"hook {row.hook!r} is not registered in this worker (AGENTRT_HOOK_MODULES / agent_hooks)",
            None,
            True,
        )
    run = Run.objects.select_related("agent").filter(id=row.run_id).first()
    if run is None:
        return False, "the run no longer exists", None, False
    view = RunView(
        run=run_to_dict(run), tenant=row.tenant.name, event=row.event_type, delivery=str(row.id), attempt=row.attempts
    )
    fn(view)
    return True, "", None, False


def _send(row: Delivery):
    sub = row.subscription
    if sub is None:
        return False, "the subscription was deleted", None, CANCELLED
    if not sub.active and row.event_type != "webhook.test":
        return False, "the subscription is inactive", None, CANCELLED
    try:
        secret = decrypt(sub.secret_encrypted)
    except SecretUnreadable as exc:
        return False, str(exc), None, True
    answer = outbound.post(
        url=sub.url,
        secret=secret,
        payload=row.payload,
        delivery_id=str(row.id),
        event_type=row.event_type,
        attempt=row.attempts,
    )
    return answer.ok, answer.error, answer.status, answer.retry
