"""Deliveries sweep (every AGENTRT_DELIVERY_SWEEP_SECONDS): ring the hook and
webhook deliveries that are due again — a retry whose backoff has passed, a
claim that lapsed (its worker died mid-delivery), a doorbell that was lost —
and end those older than AGENTRT_DELIVERY_MAX_AGE_SECONDS as failed.

A delivery is rung when it is due and was not rung since it became due (or
was rung longer than a claim ago and is still pending: that doorbell was
lost). Ringing sets `rung_at` and enqueues the task in the sweep's
transaction; a doorbell that finds the delivery not due (another worker has
it) exits quietly, so a spare one costs one UPDATE of zero rows.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Concat

from runs.runtime.queue import db_now
from webhooks.models import Delivery
from webhooks.outbox import ring

from ..locks import try_sweep_lock

BATCH = 200


def sweep_deliveries() -> dict:
    with transaction.atomic():
        if not try_sweep_lock("sweep.deliveries"):
            return {"skipped": True}
        now = db_now()
        claim = timedelta(seconds=float(settings.AGENTRT_DELIVERY_CLAIM_SECONDS))
        expired = Delivery.objects.filter(
            status="pending",
            due_at__lte=now,
            created_at__lt=now - timedelta(seconds=float(settings.AGENTRT_DELIVERY_MAX_AGE_SECONDS)),
        )
        gave_up = expired.update(status="failed", last_error=Concat(Value(_GAVE_UP), F("last_error")), updated_at=now)
        due = list(
            Delivery.objects.filter(status="pending", due_at__lte=now)
            .filter(Q(rung_at__isnull=True) | Q(rung_at__lt=F("due_at")) | Q(rung_at__lt=now - claim))
            .order_by("due_at")
            .values_list("id", flat=True)[:BATCH]
        )
        if due:
            Delivery.objects.filter(id__in=due).update(rung_at=now)
            for delivery_id in due:
                ring(delivery_id)
    return {"rung": len(due), "gave_up": gave_up}


_GAVE_UP = "gave up: no attempt succeeded within AGENTRT_DELIVERY_MAX_AGE_SECONDS; the last: "
