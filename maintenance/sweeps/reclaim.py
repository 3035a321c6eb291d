"""Reclaim sweep (every lease/6 s): resume RUNNING runs whose lease expired,
and ring again for QUEUED runs that have no pending doorbell — but not for
the runs of a tenant that holds its share of leases (fair workers): a claim
spent their doorbells on purpose, and the next run of the tenant to release
its lease rings for one of them (runs/runtime/queue.py, ring_for_queued).

Candidates are selected under the sweep lock; each is acted on outside that
transaction. The takeover is guarded by the epoch the sweep saw, the expiry
and the status (River #1302), so a run that completed meanwhile is left
alone, and a waiting run is never touched (it is not RUNNING)."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count
from django_q.models import OrmQ

from maintenance.locks import try_sweep_lock
from runs.clock import CLOCK
from runs.models import Run
from runs.runtime import liveness
from runs.runtime.enqueue import enqueue_drive
from runs.runtime.faults import fire
from runs.runtime.queue import db_now, tenant_share
from runs.runtime.resume import RunLeased, RunNotRunning, run_resume

log = logging.getLogger("agentrt.maintenance")
BATCH = 100


def pending_doorbells(now, grace_seconds: float) -> set[str]:
    """Run ids with a drive_run task that will still be delivered (see `read_doorbells`)."""
    return read_doorbells(now, grace_seconds)[0]


def read_doorbells(now, grace_seconds: float) -> tuple[set[str], dict[str, list[int]]]:
    """The queue's drive_run doorbells: the run ids with one that will still
    be delivered — waiting in django-q2's ORM queue, or taken by a worker less
    than `grace_seconds` ago — and, by run id, the rows of the lost ones.

    A row a worker took longer ago than that, for a run that is still QUEUED,
    is a lost doorbell: the worker (or the pusher that took it for the
    workers) died with it, and django-q2 hands it out again only after
    `retry`, minutes later, behind whatever was rung meanwhile."""

    retry = timedelta(seconds=settings.Q_CLUSTER["retry"])
    ids: set[str] = set()
    lost: dict[str, list[int]] = {}
    for row in OrmQ.objects.all()[:5000]:
        try:
            task = row.task
            if task.get("func") != "runs.tasks.drive_run" or not task.get("args"):
                continue
        except Exception:  # an unreadable package is not ours to judge
            continue
        run_id = str(task["args"][0])
        taken_at = row.lock - retry if row.lock and row.lock > now else None
        if taken_at is None or (now - taken_at).total_seconds() < grace_seconds:
            ids.add(run_id)
        else:
            lost.setdefault(run_id, []).append(row.id)
    return ids, lost


def drop_spent_doorbells(lost: dict[str, list[int]]) -> int:
    """Delete the lost doorbells of the runs that get a new one, and every
    doorbell (lost or waiting) of a run that has ended: each would come back
    after `retry` only to find nothing to do, and under a crash loop of
    pushers they pile up by the thousand ahead of the doorbells that matter.
    A worker that does still hold one acknowledges by deleting its row, which
    a delete here makes a no-op; a run is claimed only by its guarded UPDATE,
    never because a row exists."""
    ended = set(
        str(i)
        for i in Run.objects.filter(id__in=list(lost), status__in=("COMPLETED", "FAILED", "CANCELLED")).values_list(
            "id", flat=True
        )
    )
    rows = [row for run_id, rows in lost.items() for row in rows]
    removed = OrmQ.objects.filter(id__in=rows).delete()[0] if rows else 0
    return removed + (_drop_waiting_of(ended) if ended else 0)


def _drop_waiting_of(run_ids: set[str]) -> int:
    doomed = []
    for row in OrmQ.objects.all()[:5000]:
        try:
            task = row.task
        except Exception:
            continue
        if task.get("func") == "runs.tasks.drive_run" and task.get("args") and str(task["args"][0]) in run_ids:
            doomed.append(row.id)
    return OrmQ.objects.filter(id__in=doomed).delete()[0] if doomed else 0


def _tenants_at_share(share: int):
    """The tenants holding `share` RUNNING runs or more (a subquery)."""
    return (
        Run.objects.filter(status="RUNNING")
        .values("tenant_id")
        .annotate(held=Count("id"))
        .filter(held__gte=share)
        .values("tenant_id")
    )


def sweep_reclaim(*, queued_grace_seconds: float = 5.0) -> dict:
    with transaction.atomic():
        if not try_sweep_lock("sweep.leases"):
            return {"skipped": True}
        now = db_now()
        expired = list(
            Run.objects.filter(status="RUNNING", lease_expires_at__lt=now)
            .order_by("lease_expires_at")
            .values_list("id", "lease_epoch")[:BATCH]
        )
        queued = Run.objects.filter(status="QUEUED", updated_at__lt=now - timedelta(seconds=queued_grace_seconds))
        share = tenant_share()
        if share > 0:
            queued = queued.exclude(tenant_id__in=_tenants_at_share(share))
        stale_queued = list(queued.values_list("id", flat=True)[:BATCH])
    resumed = 0
    outcomes: dict[str, int] = {}
    for run_id, epoch in expired:
        fire("sweep.after_select", run_id)
        try:
            outcome = run_resume(run_id=run_id, via="sweep", seen_epoch=epoch)
        except (RunLeased, RunNotRunning):
            continue
        except Exception:
            log.exception("reclaim of run %s failed", run_id)
            continue
        resumed += 1
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    rung = dropped = 0
    if stale_queued:
        waiting, lost = read_doorbells(db_now(), queued_grace_seconds)
        dropped = drop_spent_doorbells(lost)
        for run_id in stale_queued:
            if str(run_id) not in waiting:
                enqueue_drive(run_id)
                rung += 1
    return {
        "expired": len(expired),
        "resumed": resumed,
        "outcomes": outcomes,
        "requeued_doorbells": rung,
        "dropped_doorbells": dropped,
        "at": CLOCK.now().isoformat(),
    }


def sweep_dead_owners() -> dict:
    """Take over, before their leases expire, the runs whose owner's process
    has no session any more (runs/runtime/liveness.py): a SIGKILLed or
    crashed worker's runs go on within a probe tick instead of a lease. The
    takeover is guarded by the epoch and the owner the probe saw; an owner
    whose session is there — a stalled or partitioned worker — keeps the
    lease rule."""
    if not liveness.enabled():
        return {"skipped": True}
    live = list(
        Run.objects.filter(status="RUNNING", lease_expires_at__gte=db_now())
        .exclude(lease_owner__isnull=True)
        .exclude(lease_owner="")
        .values_list("id", "lease_epoch", "lease_owner")[:BATCH]
    )
    dead = liveness.dead_processes(liveness.process_of(owner) for _, _, owner in live)
    taken = 0
    for run_id, epoch, owner in live:
        if liveness.process_of(owner) not in dead:
            continue
        try:
            run_resume(run_id=run_id, via="sweep", seen_epoch=epoch, dead_owner=owner)
        except (RunLeased, RunNotRunning):
            continue
        except Exception:
            log.exception("dead-owner takeover of run %s failed", run_id)
            continue
        log.info("run %s: its owner %s has no session; taken over", run_id, owner)
        taken += 1
    return {"probed": len(live), "dead_processes": len(dead), "taken_over": taken}
