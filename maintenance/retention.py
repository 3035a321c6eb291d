"""Retention: an ended run's detail removed, its row kept.

What goes (a run's *detail*): its events, tool invocations, approvals, model
calls (one row per model attempt; the run's `usage` keeps their totals),
checkpoints, and its webhook/hook deliveries that are no longer pending.
What stays: the run row — status, input, final message, result, failure,
usage, step count, lineage, times — which the runs list, a session's later
runs (their history is each earlier run's input and final answer) and usage
reports read. The row is stamped `detail_removed_at`; such a run is never
retried, forked or replayed (there is nothing left to continue from).

Which runs: a tenant's runs that are COMPLETED, FAILED or CANCELLED and were
last written before the cutoff (`updated_at`, which the run's end sets and
which nothing before it can pass: a run that ended later, or was written to
later, is kept). A run in any other status is never touched, whatever its
age: a run waiting for a person or still running keeps everything.

How: a batch at a time (`BATCH` runs), each batch one transaction —

1. the candidates, through `runs_detail_kept_idx` (the tenant's ended runs
   that still hold their detail, oldest first): one index range read;
2. the same runs locked and checked again (`FOR UPDATE SKIP LOCKED`: a run a
   retry or a cancel holds right now is left for the next batch; one that is
   no longer ended, or was written since the candidates were read, drops out;
   so does one whose figures the metrics sweep has not folded into
   `metric_totals` yet: its invocations and events are what it counts);
3. one DELETE per table by run key (each table's index that leads with the
   run), then the stamp.

The retention sweep (maintenance/sweeps/retention.py) and
`manage.py purge_runs` both call `remove_detail`."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction

from approvals.models import Approval
from checkpoints.models import Checkpoint
from ops.models import UnfoldedRun
from runs.models import TERMINAL, Event, ModelCall, Run, ToolInvocation
from runs.runtime.queue import db_now
from webhooks.models import Delivery

BATCH = 100  # runs per transaction

# The detail tables, in the order they are deleted from (approvals name invocations).
DETAIL = (
    ("approvals", Approval),
    ("tool_invocations", ToolInvocation),
    ("model_calls", ModelCall),
    ("checkpoints", Checkpoint),
    ("events", Event),
    ("deliveries", Delivery),
)


@dataclass
class Removed:
    """What a removal did (or, for a dry run, would do): runs, and rows per table."""

    runs: int = 0
    rows: dict[str, int] = field(default_factory=lambda: {name: 0 for name, _ in DETAIL})

    def add(self, other: Removed) -> None:
        self.runs += other.runs
        for name, n in other.rows.items():
            self.rows[name] += n

    def as_json(self) -> dict:
        return {"runs": self.runs, **self.rows}


def candidates(tenant_id, cutoff: datetime, limit: int, after: tuple | None = None):
    """The tenant's ended runs that still hold their detail and were last
    written before `cutoff`, oldest first, `limit` at most, past `after`
    ((created_at, id) of the last run of the previous page, for a dry run)."""
    qs = Run.objects.filter(
        tenant_id=tenant_id,
        status__in=TERMINAL,
        detail_removed_at__isnull=True,
        created_at__lt=cutoff,  # a run written before the cutoff was created before it: the index's range
        updated_at__lt=cutoff,
    )
    if after is not None:
        qs = qs.filter(created_at__gte=after[0]).exclude(created_at=after[0], id__lte=after[1])
    return qs.order_by("created_at", "id").values_list("created_at", "id")[:limit]


def _detail(model, ids):
    rows = model.objects.filter(run_id__in=ids)
    return rows.exclude(status="pending") if model is Delivery else rows


def count_detail(tenant_id, cutoff: datetime) -> Removed:
    """What `remove_detail` would remove now (a dry run): read a page at a time, nothing written."""
    total = Removed()
    after = None
    while page := list(candidates(tenant_id, cutoff, BATCH, after)):
        ids = [rid for _, rid in page]
        total.runs += len(ids)
        for name, model in DETAIL:
            total.rows[name] += _detail(model, ids).count()
        after = page[-1]
    return total


def remove_batch(tenant_id, cutoff: datetime, limit: int = BATCH) -> Removed:
    """One batch, one transaction: the candidates locked, checked again, their detail deleted, their rows stamped."""
    done = Removed()
    with transaction.atomic():
        ids = [rid for _, rid in candidates(tenant_id, cutoff, limit)]
        if not ids:
            return done
        held = list(
            Run.objects.select_for_update(skip_locked=True)
            .filter(
                id__in=ids,  # the tenant's: read from its candidates (no tenant filter here, which the planner
                # would serve by reading all the tenant's entries of runs_tenant_created_idx)
                status__unindexed__in=TERMINAL,  # checked on the locked row, by its key only
                detail_removed_at__isnull=True,
                updated_at__lt=cutoff,
            )
            .exclude(id__in=UnfoldedRun.objects.filter(run_id__in=ids).values("run_id"))  # its figures not yet counted
            .order_by("id")
            .values_list("id", flat=True)
        )
        if not held:
            return done
        for name, model in DETAIL:
            qs = _detail(model, held)
            done.rows[name] = qs._raw_delete(qs.db)  # one DELETE by run key: nothing else refers to these rows
        done.runs = Run.objects.filter(id__in=held).update(detail_removed_at=db_now())
    return done


def remove_detail(tenant_id, cutoff: datetime, *, max_runs: int | None = None) -> Removed:
    """Remove the detail of the tenant's runs that ended before `cutoff`, a
    batch at a time, until none is left (or `max_runs` were done)."""
    total = Removed()
    while max_runs is None or total.runs < max_runs:
        limit = BATCH if max_runs is None else min(BATCH, max_runs - total.runs)
        batch = remove_batch(tenant_id, cutoff, limit)
        if not batch.runs:
            break
        total.add(batch)
    return total
