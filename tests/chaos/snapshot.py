"""The database as the checker (tests/chaos/checker.py) reads it: every row
that the invariants judge, as plain dicts (UUIDs as strings, timestamps as
POSIX seconds), read through Django's connection. Shared by the chaos soak
and the rolling-deploy benchmark (bench/rolling_deploy.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime


def _val(x):
    if isinstance(x, datetime):
        return x.timestamp()
    if hasattr(x, "hex") and type(x).__name__ == "UUID":
        return str(x)
    return x


def _rows(sql: str, names: list[str], json_cols=()) -> list[dict]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(sql)
        out = []
        for row in cur.fetchall():
            d = {n: _val(v) for n, v in zip(names, row, strict=True)}
            for c in json_cols:
                d[c] = json.loads(d[c]) if isinstance(d[c], str) else d[c]
            out.append(d)
        return out


def take_snapshot(*, meta: dict, annotate: Callable[[dict], None] | None = None) -> dict:
    """`annotate(run_row)` may add what the caller knows of a run (its plan, ...)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SET statement_timeout = 0")
    runs = _rows(
        "SELECT id, status, session_id, lease_owner, lease_epoch, lease_expires_at, lease_expirations, attempts,"
        " failure,"
        " cancel_requested_at, created_at, updated_at FROM runs",
        [
            "id",
            "status",
            "session_id",
            "lease_owner",
            "lease_epoch",
            "lease_expires_at",
            "lease_expirations",
            "attempts",
            "failure",
            "cancel_requested_at",
            "created_at",
            "updated_at",
        ],
        ["failure"],
    )
    if annotate is not None:
        for r in runs:
            annotate(r)
    doorbells = []
    try:
        from django_q.models import OrmQ

        for q in OrmQ.objects.all():
            try:
                task = q.task
                doorbells.append(
                    {"run": str(task.get("args", [None])[0]), "lock": _val(q.lock), "func": task.get("func")}
                )
            except Exception:
                continue
    except Exception:
        pass
    return {
        "doorbells": doorbells,
        "runs": runs,
        "sessions": _rows("SELECT id, event_seq FROM sessions", ["id", "event_seq"]),
        # xid: the writing transaction of each row's current version (xmin), for I3's "epoch at the time of the write"
        "events": _rows(
            "SELECT session_id, sequence, run_id, type, payload, lease_epoch, occurred_at, xmin::text::bigint"
            " FROM events",
            ["session_id", "sequence", "run_id", "type", "payload", "lease_epoch", "occurred_at", "xid"],
            ["payload"],
        ),
        "invocations": _rows(
            "SELECT id, run_id, step_number, call_index, tool_name, read_only, status, effect_sent_at, attempt,"
            " result IS NOT NULL, idempotency_key, lease_epoch, suspended_kind, xmin::text::bigint"
            " FROM tool_invocations",
            [
                "id",
                "run_id",
                "step_number",
                "call_index",
                "tool_name",
                "read_only",
                "status",
                "effect_sent_at",
                "attempt",
                "has_result",
                "idempotency_key",
                "lease_epoch",
                "suspended_kind",
                "xid",
            ],
        ),
        "model_calls": _rows(
            "SELECT run_id, step_number, attempt_number, status, lease_epoch, xmin::text::bigint FROM model_calls",
            ["run_id", "step_number", "attempt_number", "status", "lease_epoch", "xid"],
        ),
        "checkpoints": _rows(
            'SELECT run_id, version, "trigger", lease_epoch, xmin::text::bigint FROM checkpoints',
            ["run_id", "version", "trigger", "lease_epoch", "xid"],
        ),
        "approvals": [
            {**a, "attempt": (a.pop("presentation") or {}).get("attempt")}
            for a in _rows(
                "SELECT id, run_id, invocation_id, kind, status, decided_at, decided_via, presentation, created_at"
                " FROM approvals",
                [
                    "id",
                    "run_id",
                    "invocation_id",
                    "kind",
                    "status",
                    "decided_at",
                    "decided_via",
                    "presentation",
                    "created_at",
                ],
                ["presentation"],
            )
        ],
        "meta": meta,
    }
