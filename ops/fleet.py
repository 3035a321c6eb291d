"""Selectors for the deployment as a whole (seed 002's series and the fleet
gauges), read from the shared database so every web node reports the same
figures whatever node did the work.

Every query is one aggregate over an index: the counters read only the rare
event types of `events_metrics_idx` (a partial index, ops/migrations/0001),
the gauges read the live rows of `runs` and the pending rows of `approvals`.
Counters are totals over the event log, so they never go down while events
are kept; histograms are computed in SQL (cumulative bucket counts), so a
scrape moves a few dozen numbers, not rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import connection

from runs.domain.values import RunStatus

STEP_BUCKETS = (1, 2, 3, 5, 8, 13, 21, 34, 55, 89)
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 900, 1800, 3600, 7200, 14400, 43200, 86400)

# What a lost lease interrupted, worst first (seed 002: a lease lost while a
# side effect's outcome is unknown is an incident, one lost between steps is
# a short lease). Ranked so one takeover gets its worst phase.
LEASE_PHASES = {4: "side_effect", 3: "executing", 2: "deciding", 1: "idle"}


@dataclass
class Histogram:
    buckets: list[tuple[float, int]] = field(default_factory=list)  # (upper bound, cumulative count), +Inf last
    count: int = 0
    total: float = 0.0


def _is_pg() -> bool:
    return connection.vendor == "postgresql"


def _rows(sql: str, params=()) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, list(params))
        return cursor.fetchall()


def _seconds(later: str, earlier: str) -> str:
    if _is_pg():
        return f"EXTRACT(EPOCH FROM ({later} - {earlier}))"
    return f"((julianday({later}) - julianday({earlier})) * 86400.0)"


def _bucketed(value: str, bounds: tuple) -> str:
    """SELECT fragments: one cumulative count per bound, then count and sum."""
    parts = [f"COUNT(*) FILTER (WHERE {value} <= {b})" for b in bounds]
    return ", ".join(parts + ["COUNT(*)", f"COALESCE(SUM({value}), 0)"])


def _histograms(rows, bounds) -> dict[str, Histogram]:
    out = {}
    for label, *values in rows:
        cumulative, count, total = values[: len(bounds)], values[len(bounds)], values[len(bounds) + 1]
        buckets = [(float(b), int(n)) for b, n in zip(bounds, cumulative)] + [(float("inf"), int(count))]
        out[label] = Histogram(buckets=buckets, count=int(count), total=float(total))
    return out


def _counts(sql: str, params=()) -> dict[str, int]:
    return {str(label): int(n) for label, n in _rows(sql, params)}


# Label values known in advance are exported at 0, so an alert's rate() has
# a series before the first event.
KNOWN = {
    "cancelled": ("requested",),
    "leases_lost": tuple(LEASE_PHASES.values()),
    "requeued": ("slice_end", "drain", "resume", "approval", "input"),
    "compactions": ("pressure",),
}


def _zeros(kind: str, counts: dict[str, int]) -> dict[str, int]:
    return {**{label: 0 for label in KNOWN[kind]}, **counts}


def fleet_counters() -> dict[str, dict]:
    """Seed 002's six counters and two histograms, deployment-wide."""
    empty_steps = _histograms(
        [(o, *([0] * (len(STEP_BUCKETS) + 2))) for o in ("completed", "failed", "cancelled")], STEP_BUCKETS
    )
    empty_waits = _histograms([(k, *([0] * (len(WAIT_BUCKETS) + 2))) for k in ("approval", "user")], WAIT_BUCKETS)
    return {
        "run_steps": {**empty_steps, **fleet_run_steps()},
        # A run ends CANCELLED only on request here (a passed deadline fails
        # it `deadline_exceeded`); events written without a reason are requests.
        "cancelled": _zeros(
            "cancelled",
            _counts(
                "SELECT COALESCE(payload->>'reason', 'requested'), COUNT(*) FROM events WHERE type = 'run.cancelled' GROUP BY 1"
            ),
        ),
        "leases_lost": _zeros("leases_lost", fleet_leases_lost()),
        "requeued": _zeros(
            "requeued",
            _counts(
                "SELECT COALESCE(payload->>'reason', 'unknown'), COUNT(*) FROM events WHERE type = 'run.requeued' GROUP BY 1"
            ),
        ),
        "compactions": _zeros(
            "compactions",
            _counts(
                "SELECT COALESCE(payload->>'reason', 'pressure'), COUNT(*) FROM events WHERE type = 'context.compacted' GROUP BY 1"
            ),
        ),
        "tool_uncertain": fleet_tool_uncertain(),
        "waiting": {**empty_waits, **fleet_waiting_seconds()},
    }


def fleet_run_steps() -> dict[str, Histogram]:
    """Steps per run by terminal outcome (`completed`, `failed`, `cancelled`)."""
    rows = _rows(
        f"SELECT LOWER(status), {_bucketed('step_count', STEP_BUCKETS)} FROM runs"
        " WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED') GROUP BY status"
    )
    return _histograms(rows, STEP_BUCKETS)


def fleet_leases_lost() -> dict[str, int]:
    """One per takeover (`lease.taken_over`), labelled by the worst thing it
    interrupted: the `step.interrupted` events the takeover wrote in its own
    transaction (same run, same new epoch)."""
    rows = _rows(
        "SELECT rank, COUNT(*) FROM ("
        " SELECT t.id, MAX(CASE"
        "   WHEN s.payload->>'outcome' = 'unknown' THEN 4"
        "   WHEN s.payload->>'phase' = 'executing' THEN 3"
        "   WHEN s.payload->>'phase' = 'deciding' THEN 2"
        "   ELSE 1 END) AS rank"
        " FROM events t LEFT JOIN events s"
        "   ON s.type = 'step.interrupted' AND s.run_id = t.run_id AND s.lease_epoch = t.lease_epoch"
        " WHERE t.type = 'lease.taken_over' GROUP BY t.id) x GROUP BY rank"
    )
    return {LEASE_PHASES[int(rank)]: int(n) for rank, n in rows}


def fleet_tool_uncertain() -> dict[str, int]:
    """Tool calls whose outcome is unknown, by tool: `tool.call.failed` with
    `outcome: "uncertain"` (the invocation outcome classes), the same events
    `runs.services.selectors.tool_uncertain_counts` reads."""
    return _counts(
        "SELECT COALESCE(payload->>'tool', 'unknown'), COUNT(*) FROM events"
        " WHERE type = 'tool.call.failed' AND payload->>'outcome' = 'uncertain' GROUP BY 1"
    )


def fleet_waiting_seconds() -> dict[str, Histogram]:
    """Time runs spent waiting, by suspension kind (`approval`, `user`,
    `child_run`): each `run.waiting_*` event to the next event that ends the
    wait in the same run (requeued by a decision or input, cancelled,
    failed). Observed when the wait ends; open waits are the pending gauges."""
    secs = _seconds("ended_at", "occurred_at")
    rows = _rows(
        f"SELECT kind, {_bucketed('secs', WAIT_BUCKETS)} FROM ("
        f" SELECT kind, {secs} AS secs FROM ("
        "  SELECT type, occurred_at,"
        "   COALESCE(payload->>'kind', CASE WHEN type = 'run.waiting_for_user' THEN 'user' ELSE 'approval' END) AS kind,"
        "   LEAD(occurred_at) OVER (PARTITION BY run_id ORDER BY id) AS ended_at"
        "  FROM events WHERE type IN ('run.waiting_for_approval', 'run.waiting_for_user', 'run.requeued', 'run.cancelled', 'run.failed')"
        " ) w WHERE type IN ('run.waiting_for_approval', 'run.waiting_for_user') AND ended_at IS NOT NULL"
        ") d GROUP BY kind"
    )
    return _histograms(rows, WAIT_BUCKETS)


def fleet_snapshot() -> dict:
    """The fleet at a glance: runs by status, the queue, live workers,
    pending approvals. Ages are measured on the database's clock."""
    now_sql = "now()" if _is_pg() else "CURRENT_TIMESTAMP"
    by_status = {s.value: 0 for s in RunStatus}
    by_status.update(_counts("SELECT status, COUNT(*) FROM runs GROUP BY status"))
    ((depth, oldest_queued),) = _rows(
        f"SELECT COUNT(*), MAX({_seconds(now_sql, 'updated_at')}) FROM runs WHERE status = 'QUEUED'"
    )
    owners = [
        o
        for (o,) in _rows(
            f"SELECT lease_owner FROM runs WHERE status = 'RUNNING' AND lease_owner IS NOT NULL AND lease_expires_at > {now_sql}"
        )
    ]
    from approvals.models import Approval

    approvals = {kind: {"pending": 0, "oldest_age_seconds": 0.0} for kind, _ in Approval.KINDS}
    approvals.update(
        {
            kind: {"pending": int(n), "oldest_age_seconds": max(0.0, float(age or 0))}
            for kind, n, age in _rows(
                f"SELECT kind, COUNT(*), MAX({_seconds(now_sql, 'created_at')}) FROM approvals WHERE status = 'pending' GROUP BY kind"
            )
        }
    )
    return {
        "runs_by_status": by_status,
        "queue": {"depth": int(depth), "oldest_age_seconds": max(0.0, float(oldest_queued or 0))},
        # A worker is live while it renews a lease (its heartbeat): the
        # owner is host:pid:claim, so host:pid is one worker process.
        "live_workers": len({o.rsplit(":", 1)[0] for o in owners}),
        "leased_runs": len(owners),
        "approvals": approvals,
        "oldest_pending_approval_seconds": max((a["oldest_age_seconds"] for a in approvals.values()), default=0.0),
    }
