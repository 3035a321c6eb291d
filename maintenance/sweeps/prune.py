"""Checkpoint prune: a terminal run keeps its final full snapshot; the chain
before it is needed by nothing.

The sweep finds runs that ended through their terminal event (`run.completed`,
`run.failed`, `run.cancelled`: every ending writes one, in the transaction
that ends the run), read by id through the partial index `events_ended_idx`
(ops/migrations/0002_flat_read_indexes.py), a batch at a time: never a scan
of the runs, events or checkpoints table (flat in table size). The runs table gets no
index for this: one on `updated_at` would make every step's update of the
run row a non-HOT one (see ops/migrations/0001_metrics_indexes.py).

Each maintenance process keeps two marks, both at its first sweep's newest
terminal event older than RECENT_SECONDS:

- forward: endings after it are read at every sweep; the mark advances only
  to endings older than RECENT_SECONDS, so an ending whose transaction
  committed after a later one's (ids are taken at insert) is still seen;
- backward: endings before it are read newest first, BACKFILL_BATCHES
  batches a sweep, down to the oldest: the history this process has not
  examined yet (a restart re-examines it, a few batches at a time).

Of each batch, the runs with more than one checkpoint are candidates (one
grouped read of the checkpoints' (run, version) index); each is pruned by
one DELETE."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from uuid import UUID

from django.db import transaction
from django.db.models import Count, F, Subquery

from checkpoints.models import Checkpoint
from maintenance.locks import try_sweep_lock
from runs.domain.events import EventType
from runs.models import Event
from runs.runtime.queue import db_now

BATCH = 200
SCAN_BATCH = 1000  # terminal events read per query
BACKFILL_BATCHES = 5  # history examined per sweep: 5,000 endings (the sweep's read transaction stays short)
RECENT_SECONDS = 300.0
ENDED = (EventType.RUN_COMPLETED.value, EventType.RUN_FAILED.value, EventType.RUN_CANCELLED.value)

# This process's marks (event ids); None until its first sweep.
_marks: dict[str, int | None] = {"forward": None, "backward": None}


def reset_marks() -> None:
    """Forget the marks: the next sweep starts as a new process's first one."""
    _marks["forward"] = _marks["backward"] = None


def _endings(**bound) -> list[tuple[int, UUID, datetime]]:
    """(event id, run id, occurred_at) of the next SCAN_BATCH endings past `bound`
    (`id__gt`: oldest first; `id__lt`: newest first)."""
    order = "id" if "id__gt" in bound else "-id"
    rows = Event.objects.filter(type__in=ENDED, **bound).order_by(order)
    return list(rows.values_list("id", "run_id", "occurred_at")[:SCAN_BATCH])


def _with_a_chain(rows) -> list:
    """The runs of `rows` that have more than one checkpoint."""
    return list(
        Checkpoint.objects.filter(run_id__in=[run_id for _, run_id, _ in rows])
        .values("run_id")
        .annotate(n=Count("version"))
        .filter(n__gt=1)
        .values_list("run_id", flat=True)
    )


def _candidates(limit: int) -> tuple[list, dict[str, int | None]]:
    """Runs with a chain to prune — every one that ended after the forward
    mark, then history, newest first, until `limit` are found — and the
    marks to keep once they are pruned."""
    marks = dict(_marks)
    settled = db_now() - timedelta(seconds=RECENT_SECONDS)
    if marks["forward"] is None:
        last = (
            Event.objects.filter(type__in=ENDED, occurred_at__lt=settled).order_by("-id").values_list("id", flat=True)
        )
        start = last.first() or 0
        marks["forward"], marks["backward"] = start, start + 1
    found: list = []
    key, settling = marks["forward"], False
    while len(found) < limit and (rows := _endings(id__gt=key)):
        found += _with_a_chain(rows)
        key = rows[-1][0]
        for event_id, _, at in rows:  # the mark moves over settled endings only: a recent one is read again
            settling = settling or at >= settled
            if not settling:
                marks["forward"] = event_id
    batches = 0
    while marks["backward"] and len(found) < limit and batches < BACKFILL_BATCHES:
        rows = _endings(id__lt=marks["backward"])
        batches += 1
        found += _with_a_chain(rows)
        marks["backward"] = rows[-1][0] if len(rows) == SCAN_BATCH else 0  # 0: the history is done
    return list(dict.fromkeys(found)), marks


log = logging.getLogger("agentrt.maintenance")


def sweep_prune() -> dict:
    with transaction.atomic():
        if not try_sweep_lock("sweep.checkpoints"):
            return {"skipped": True}
        candidates, marks = _candidates(BATCH * 5)
    deleted = failed = 0
    for run_id in candidates:
        try:
            deleted += _prune_run(run_id)
        except Exception as exc:
            # Each run is its own transaction (rolled back): log the run and the error class only — never
            # checkpoint content or the exception's text — and go on with the other runs.
            failed += 1
            log.warning("prune: run %s failed (%s); its checkpoints are kept", run_id, type(exc).__name__)
    if not failed:
        _marks.update(marks)  # only now: a pass that failed part-way reads the same endings again next time
    return {"runs": len(candidates), "deleted": deleted, "failed": failed}


def _prune_run(run_id) -> int:
    """One DELETE: the versions before the run's final full snapshot, only if
    that snapshot is also its last version (a terminal run without its final
    snapshot keeps its chain for diagnosis). No transaction spans two
    statements, so a process starved between them cannot hold one open."""
    versions = Checkpoint.objects.filter(run_id=run_id).order_by("-version").values("version")
    n, _ = (
        Checkpoint.objects.filter(run_id=run_id)
        .annotate(final=Subquery(versions.filter(full=True)[:1]), top=Subquery(versions[:1]))
        .filter(version__lt=F("final"), final=F("top"))
        .delete()
    )
    return n
