"""Retention sweep: with `AGENTRT_RETENTION_DAYS` set, the ended runs of
every tenant last written more than that many days ago lose their detail
(maintenance/retention.py says what goes and what stays), `MAX_RUNS` runs a
sweep at most, a batch of runs per transaction, a tenant at a time. Off
(the default) when the setting is unset or 0."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction

from maintenance.locks import try_sweep_lock
from maintenance.retention import Removed, remove_detail
from runs.models import Tenant
from runs.runtime.queue import db_now

MAX_RUNS = 2000  # runs a sweep handles at most; the rest wait for the next one


def sweep_retention() -> dict:
    days = settings.AGENTRT_RETENTION_DAYS
    if not days:
        return {"skipped": True}
    with transaction.atomic():
        if not try_sweep_lock("sweep.retention"):
            return {"skipped": True}
        tenants = list(Tenant.objects.order_by("id").values_list("id", flat=True))
    cutoff = db_now() - timedelta(days=days)
    total = Removed()
    for tenant_id in tenants:
        if total.runs >= MAX_RUNS:
            break
        total.add(remove_detail(tenant_id, cutoff, max_runs=MAX_RUNS - total.runs))
    return {"detail_removed_runs": total.runs, **{k: v for k, v in total.rows.items() if v}}
