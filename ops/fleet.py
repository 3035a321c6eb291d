"""Selectors for the deployment as a whole (the run series and the fleet
gauges), read from the shared database so every web node reports the same
figures whatever node did the work.

The counters and histograms are one statement (`contributions`) that reads
each run's counted events once (the rare types of the partial indexes
`events_metrics_idx` and `events_metrics_run_idx`) and its final step count,
and returns (series, label, bucket, value) rows; histograms are cumulative
bucket counts computed in SQL, so a scrape moves a few dozen numbers, not
rows. Counters never go down.

On PostgreSQL a scrape does not read the runs that ended: their figures were
added up once into `metric_totals` by the `metrics` sweep (`fold`), and a
scrape adds those totals to the same statement run over the runs not folded
yet (`UNFOLDED`: the live ones and those that ended in the last seconds),
read run by run, in one statement (`deployment_counters`). Its cost follows
the live runs, not the history. SQLite reads the tables whole. The gauges
read the live rows of `runs` and the pending rows of `approvals`."""

from __future__ import annotations

from dataclasses import dataclass, field
from uuid import UUID

from django.db import connection, transaction

from approvals.models import Approval
from runs.domain.values import RunStatus
from runs.tools import REGISTRY

STEP_BUCKETS = (1, 2, 3, 5, 8, 13, 21, 34, 55, 89)
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 900, 1800, 3600, 7200, 14400, 43200, 86400)

# What a lost lease interrupted, worst first (a lease lost while a
# side effect's outcome is unknown is an incident, one lost between steps is
# a short lease). Ranked so one takeover gets its worst phase.
LEASE_PHASES = {4: "side_effect", 3: "executing", 2: "deciding", 1: "idle"}


@dataclass
class Histogram:
    buckets: list[tuple[float, int]] = field(default_factory=list)  # (upper bound, cumulative count), +Inf last
    count: int = 0
    total: float = 0.0


TERMINAL = "('COMPLETED', 'FAILED', 'CANCELLED')"
# The event types the counters read (events_metrics_idx and events_metrics_run_idx hold only these).
COUNTED = (
    "'run.cancelled', 'run.requeued', 'run.failed', 'lease.taken_over', 'step.interrupted', 'context.compacted',"
    " 'tool.call.failed', 'run.waiting_for_approval', 'run.waiting_for_user'"
)
HISTOGRAMS = {"run_steps": STEP_BUCKETS, "waiting": WAIT_BUCKETS}
COUNTERS = ("cancelled", "leases_lost", "requeued", "compactions", "tool_uncertain", "mcp_calls")
# The results of MCP tool calls, read through their own partial index, events_mcp_calls_idx
# (ops/migrations/0008: the same predicate), which no other event writes to. `%%` is `%` once the
# statement's parameters are bound.
MCP_CALLS = (
    "x.type IN ('tool.call.completed', 'tool.call.failed') AND x.payload->>'tool' LIKE 'mcp\\_\\_%%' ESCAPE '\\'"
)


@dataclass(frozen=True)
class Scope:
    """The runs whose figures are added up: `runs` a subquery of their ids,
    `ended` of those among them that ended (their step counts)."""

    runs: str
    ended: str
    params: tuple = ()  # the parameters of each subquery (both take the same)


# Every run whose figures are not in metric_totals: the live ones and the ended ones not folded yet.
UNFOLDED = Scope(
    runs=f"SELECT id FROM runs WHERE status NOT IN {TERMINAL} UNION ALL SELECT run_id FROM metric_unfolded_runs",
    ended="SELECT run_id FROM metric_unfolded_runs",
)


def runs_scope(run_ids: list[UUID]) -> Scope:
    return Scope(runs="SELECT unnest(%s::uuid[])", ended="SELECT unnest(%s::uuid[])", params=(list(run_ids),))


def _rows_of(table: str, ids: str | None, where: str) -> str:
    """A FROM item: the rows of `table` matching `where` (a condition on the
    alias `x`), of every run, or of the runs `ids` (a subquery) read run by
    run through an index on the run (a lateral subquery the planner may not
    flatten, OFFSET 0: a join it chose by estimate could read every matching
    row of the history to keep the few it needs)."""
    if ids is None:
        return f"(SELECT * FROM {table} x WHERE {where})"
    key = "id" if table == "runs" else "run_id"
    return (
        f"({ids}) AS scoped(id) CROSS JOIN LATERAL"
        f" (SELECT * FROM {table} x WHERE x.{key} = scoped.id AND {where} OFFSET 0)"
    )


def _execute(sql: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql)


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


def _counts(sql: str, params=()) -> dict[str, int]:
    return {str(label): int(n) for label, n in _rows(sql, params)}


def _bucket_name(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


def _histogram_rows(series: str, source: str, label: str, value: str, bounds: tuple) -> str:
    """SELECT rows of one histogram over `source`: a cumulative count per
    bound (`+Inf`: the count) and the sum, per `label`."""
    bucket_list = " UNION ALL ".join(  # (not VALUES: SQLite cannot name its columns)
        [f"SELECT '{_bucket_name(b)}' AS name, {b} AS bound" for b in bounds] + ["SELECT '+Inf', NULL"]
    )
    return (
        f"SELECT '{series}', {label}, b.name, COUNT(*) FROM {source} h"
        f" JOIN ({bucket_list}) b ON b.bound IS NULL OR {value} <= b.bound GROUP BY 2, 3"
        f" UNION ALL SELECT '{series}', {label}, 'sum', SUM({value}) FROM {source} h GROUP BY 2"
    )


def contributions(scope: Scope | None = None) -> tuple[str, tuple]:
    """One statement: the six counters and two histograms over the runs
    of `scope` (None: every run, reading the tables whole), as (series,
    label, bucket, value) rows — a counter's value per label (bucket empty),
    a histogram's cumulative count per bound (`+Inf`: its count) and its sum.
    Each run's counted events are read once."""
    if scope is None:
        events, ended, params = _rows_of("events", None, f"x.type IN ({COUNTED})"), None, ()
        mcp = _rows_of("events", None, MCP_CALLS)
    else:
        events = _rows_of("events", scope.runs, f"x.type IN ({COUNTED})")
        mcp = _rows_of("events", scope.runs, MCP_CALLS)
        ended, params = scope.ended, scope.params * 3  # events, ended, mcp
    runs = _rows_of("runs", ended, f"x.status IN {TERMINAL}")
    kind = "COALESCE(payload->>'kind', CASE WHEN type = 'run.waiting_for_user' THEN 'user' ELSE 'approval' END)"
    secs = _seconds("LEAD(occurred_at) OVER (PARTITION BY run_id ORDER BY id)", "occurred_at")
    materialized = "MATERIALIZED " if _is_pg() else ""
    sql = (
        f"WITH ev AS {materialized}(SELECT e.run_id, e.id, e.type, e.lease_epoch, e.occurred_at, e.payload"
        f"  FROM {events} e),"
        f" ended AS {materialized}(SELECT r.status, r.step_count FROM {runs} r),"
        f" mcp AS {materialized}(SELECT m.payload FROM {mcp} m),"
        # Each wait to the next event of its run that ended it (requeued by a
        # decision or input, cancelled, failed); an open wait is not observed.
        f" waits AS (SELECT kind, secs FROM (SELECT type, {kind} AS kind, {secs} AS secs FROM ev"
        "  WHERE type IN ('run.waiting_for_approval', 'run.waiting_for_user', 'run.requeued', 'run.cancelled',"
        "   'run.failed')) w"
        "  WHERE type IN ('run.waiting_for_approval', 'run.waiting_for_user') AND secs IS NOT NULL),"
        # A takeover, labelled by the worst step.interrupted it wrote (same run, same new epoch).
        " takeovers AS (SELECT t.id, MAX(CASE WHEN s.payload->>'outcome' = 'unknown' THEN 4"
        "  WHEN s.payload->>'phase' = 'executing' THEN 3 WHEN s.payload->>'phase' = 'deciding' THEN 2 ELSE 1 END)"
        "  AS rank FROM ev t LEFT JOIN ev s"
        "  ON s.type = 'step.interrupted' AND s.run_id = t.run_id AND s.lease_epoch = t.lease_epoch"
        "  WHERE t.type = 'lease.taken_over' GROUP BY t.id)"
        # A run ends CANCELLED only on request here (a passed deadline fails
        # it `deadline_exceeded`). The event's `reason` is the words of the
        # person who cancelled, never a label.
        " SELECT 'cancelled', 'requested', '', COUNT(*) FROM ev"
        "  WHERE type = 'run.cancelled' GROUP BY 2"
        " UNION ALL SELECT 'requeued', COALESCE(payload->>'reason', 'unknown'), '', COUNT(*) FROM ev"
        "  WHERE type = 'run.requeued' GROUP BY 2"
        " UNION ALL SELECT 'compactions', COALESCE(payload->>'reason', 'pressure'), '', COUNT(*) FROM ev"
        "  WHERE type = 'context.compacted' GROUP BY 2"
        # The invocation outcome classes: the same events runs.services.selectors.tool_uncertain_counts reads.
        " UNION ALL SELECT 'tool_uncertain', COALESCE(payload->>'tool', 'unknown'), '', COUNT(*) FROM ev"
        "  WHERE type = 'tool.call.failed' AND payload->>'outcome' = 'uncertain' GROUP BY 2"
        # An MCP call's result, once per attempt that ran (not a call refused before it ran): "<tool> <outcome>".
        " UNION ALL SELECT 'mcp_calls', (payload->>'tool') || ' ' || COALESCE(payload->>'outcome', 'unknown'), '',"
        "  COUNT(*) FROM mcp WHERE payload->'executed' = 'true' GROUP BY 2"
        " UNION ALL SELECT 'leases_lost', CASE rank "
        + " ".join(f"WHEN {rank} THEN '{phase}'" for rank, phase in LEASE_PHASES.items())
        + " END, '', COUNT(*) FROM takeovers GROUP BY 2"
        " UNION ALL "
        + _histogram_rows("run_steps", "ended", "LOWER(h.status)", "h.step_count", STEP_BUCKETS)
        + " UNION ALL "
        + _histogram_rows("waiting", "waits", "h.kind", "h.secs", WAIT_BUCKETS)
    )
    return sql, params


# Label values known in advance are exported at 0, so an alert's rate() has
# a series before the first event.
KNOWN = {
    "cancelled": ("requested",),
    "leases_lost": tuple(LEASE_PHASES.values()),
    "requeued": ("slice_end", "drain", "resume", "approval", "input", "child_run"),
    "compactions": ("pressure",),
    "run_steps": ("completed", "failed", "cancelled"),
    "waiting": ("approval", "user", "child_run"),
}


def _known(series: str) -> tuple[str, ...]:
    """The labels a series is exported with at 0: `KNOWN`'s, and for
    `tool_uncertain` every tool registered in this process (an alert on
    `rate(agent_tool_uncertain_total[5m]) > 0` has its series from the first
    scrape)."""
    if series == "tool_uncertain":
        return tuple(REGISTRY.names())
    return KNOWN.get(series, ())


def _empty(series: str) -> Histogram:
    return Histogram(buckets=[(float(b), 0) for b in HISTOGRAMS[series]] + [(float("inf"), 0)])


def _figures(rows, *, zeros: bool = True) -> dict[str, dict]:
    """(series, label, bucket, value) rows, added up, as the collector's
    figures: counters {label: n}, histograms {label: Histogram}."""
    out: dict[str, dict] = {series: {} for series in (*HISTOGRAMS, *COUNTERS)}
    if zeros:
        for series in (*HISTOGRAMS, *COUNTERS):
            for label in _known(series):
                out[series][label] = _empty(series) if series in HISTOGRAMS else 0
    for series, label, bucket, value in rows:
        if series in HISTOGRAMS:
            h = out[series].get(label) or out[series].setdefault(label, _empty(series))
            if bucket == "sum":
                h.total += float(value or 0)
            else:
                h.buckets = [(b, n + int(value)) if _bucket_name(b) == bucket else (b, n) for b, n in h.buckets]
                h.count = h.buckets[-1][1]
        else:
            out[series][str(label)] = out[series].get(str(label), 0) + int(value)
    return out


def fleet_counters(scope: Scope | None = None) -> dict[str, dict]:
    """The counters and histograms over the runs of `scope` (None: every run,
    reading the tables whole), known labels at 0."""
    return _figures(_rows(*contributions(scope)))


def fleet_series(name: str, scope: Scope | None = None) -> dict:
    """One series of `fleet_counters`, only the labels the runs gave."""
    return _figures(_rows(*contributions(scope)), zeros=False)[name]


# -- folded totals (PostgreSQL) ---------------------------------------------

# A handful of index probes per run in scope: compiling them (JIT, which a
# plan estimated from a stale row count can trigger) costs more than running them.
_NO_JIT = "SET LOCAL jit = off"


def deployment_counters() -> dict[str, dict]:
    """The counters of every run: on PostgreSQL the folded totals plus the
    runs not folded yet, in one statement (one snapshot: a fold committing
    meanwhile is seen whole or not at all); on SQLite the tables whole."""
    if not _is_pg():
        return fleet_counters()
    sql, params = contributions(UNFOLDED)
    with transaction.atomic():
        _execute(_NO_JIT)
        rows = _rows(
            f"SELECT series, label, bucket, value FROM metric_totals UNION ALL SELECT * FROM ({sql}) c", params
        )
    return _figures(rows)


def fold(batch: int, settled_seconds: float) -> int:
    """Add the figures of up to `batch` runs that ended at least
    `settled_seconds` ago into `metric_totals` and take them off
    `metric_unfolded_runs`, in one transaction; return how many. Runs
    another node is folding are skipped (SKIP LOCKED)."""
    with transaction.atomic():
        _execute(_NO_JIT)
        ids = [
            run_id
            for (run_id,) in _rows(
                "SELECT u.run_id FROM metric_unfolded_runs u JOIN runs r ON r.id = u.run_id"
                " WHERE r.updated_at <= now() - make_interval(secs => %s)"
                " ORDER BY u.run_id LIMIT %s FOR UPDATE OF u SKIP LOCKED",
                (settled_seconds, batch),
            )
        ]
        if not ids:
            return 0
        sql, params = contributions(runs_scope(ids))
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO metric_totals (series, label, bucket, value)"
                f" SELECT * FROM ({sql}) AS c(series, label, bucket, value) WHERE value <> 0"
                " ON CONFLICT (series, label, bucket) DO UPDATE SET value = metric_totals.value + EXCLUDED.value",
                list(params),
            )
            cursor.execute("DELETE FROM metric_unfolded_runs WHERE run_id = ANY(%s)", [ids])
        return len(ids)


def reopened(run_id: UUID) -> None:
    """In the transaction that makes an ended run live again (a retry,
    runs.runtime.retry), before its status changes: its figures stay counted
    once. Its end is an observation (`agent_run_steps`) like any end — folded
    now if the sweep has not folded it yet — and its counted events leave the
    totals, since a scrape reads a live run's events itself (`UNFOLDED`); when
    it ends again, the sweep folds them all with its new end. No-op on SQLite
    (a scrape reads the tables whole there)."""
    if not _is_pg():
        return
    sql, params = contributions(runs_scope([run_id]))
    add = (
        "INSERT INTO metric_totals (series, label, bucket, value)"
        " SELECT series, label, bucket, {sign}value FROM ({sql}) AS c(series, label, bucket, value)"
        " WHERE value <> 0{only}"
        " ON CONFLICT (series, label, bucket) DO UPDATE SET value = metric_totals.value + EXCLUDED.value"
    )
    with connection.cursor() as cursor:
        cursor.execute(_NO_JIT)
        cursor.execute("DELETE FROM metric_unfolded_runs WHERE run_id = %s RETURNING run_id", [run_id])
        if cursor.fetchone() is not None:  # not folded yet: its figures as an ended run go in now, once
            cursor.execute(add.format(sign="", sql=sql, only=""), list(params))
        cursor.execute(add.format(sign="-", sql=sql, only=" AND series <> 'run_steps'"), list(params))


def cluster_workers() -> dict[str, int]:
    """The worker processes of each `qcluster` node up now, by cluster id:
    what each node's sentinel saves every guard cycle (django-q2's cluster
    status, kept 3 s, in AGENTRT_Q_STATUS_CACHE), stopped nodes left out.
    Empty when the status cannot be read."""
    # Not at the top: django_q.status loads its broker and django_q's models, which need the app registry,
    # and this module is imported while the registry loads (runs.admin -> services -> runtime.retry).
    from django_q.conf import Conf
    from django_q.status import Stat

    try:
        stats = Stat.get_all()
    except Exception:
        return {}
    return {
        str(stat.cluster_id): len(getattr(stat, "workers", ()) or ())
        for stat in stats
        if getattr(stat, "status", None) not in (Conf.STOPPED, None)
    }


def fleet_snapshot() -> dict:
    """The fleet at a glance: runs by status, the queue, live workers,
    pending approvals. Ages are measured on the database's clock."""
    now_sql = "now()" if _is_pg() else "CURRENT_TIMESTAMP"
    by_status = {s.value: 0 for s in RunStatus}
    if _is_pg():  # the ended runs from the folded totals, not the whole table (one statement: one snapshot)
        by_status.update(
            _counts(
                "SELECT status, SUM(n) FROM ("
                f" SELECT status, COUNT(*) AS n FROM runs WHERE status NOT IN {TERMINAL} GROUP BY status"
                " UNION ALL SELECT UPPER(label), value::bigint FROM metric_totals"
                "  WHERE series = 'run_steps' AND bucket = '+Inf'"
                " UNION ALL SELECT status, COUNT(*) FROM runs"
                "  WHERE id IN (SELECT run_id FROM metric_unfolded_runs) GROUP BY status"
                ") x GROUP BY status"
            )
        )
    else:
        by_status.update(_counts("SELECT status, COUNT(*) FROM runs GROUP BY status"))
    ((depth, oldest_queued),) = _rows(
        f"SELECT COUNT(*), MAX({_seconds(now_sql, 'updated_at')}) FROM runs WHERE status = 'QUEUED'"
    )
    owners = [
        o
        for (o,) in _rows(
            "SELECT lease_owner FROM runs WHERE status = 'RUNNING' AND lease_owner IS NOT NULL"
            f" AND lease_expires_at > {now_sql}"
        )
    ]

    approvals = {kind: {"pending": 0, "oldest_age_seconds": 0.0} for kind, _ in Approval.KINDS}
    approvals.update(
        {
            kind: {"pending": int(n), "oldest_age_seconds": max(0.0, float(age or 0))}
            for kind, n, age in _rows(
                f"SELECT kind, COUNT(*), MAX({_seconds(now_sql, 'created_at')}) FROM approvals"
                " WHERE status = 'pending' GROUP BY kind"
            )
        }
    )
    # A worker renewing a lease (its heartbeat) is busy: the owner is host:pid:claim, so host:pid is one
    # worker process. Live workers are every worker process of the nodes up now, idle ones too (django-q2's
    # cluster status), and at least the busy ones (a node whose status this process cannot read).
    busy = len({o.rsplit(":", 1)[0] for o in owners})
    nodes = cluster_workers()
    return {
        "runs_by_status": by_status,
        "queue": {"depth": int(depth), "oldest_age_seconds": max(0.0, float(oldest_queued or 0))},
        "live_workers": max(busy, sum(nodes.values())),
        "busy_workers": busy,
        "nodes": len(nodes),
        "leased_runs": len(owners),
        "approvals": approvals,
        "oldest_pending_approval_seconds": max((a["oldest_age_seconds"] for a in approvals.values()), default=0.0),
    }
