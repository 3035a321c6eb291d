"""The live pages' wake-up on PostgreSQL alone: `NOTIFY agentrt_live` in the
transaction that appends a run's events.

Each statement that moves a session's event counter (the step's unit, the
watermark, `append_events` of the cold paths) also calls `pg_notify` in the
RETURNING list of that counter's UPDATE: no statement and no round trip is
added to a commit, and the notification exists only if the counter moved
(the fence matched). PostgreSQL delivers it when the transaction commits,
never for one that rolls back. Every web process LISTENs on the channel
(runs/web/live_bell.py) and wakes its sockets of that run and that tenant;
the sockets then read the events table under their own scope, so a
notification carries nothing but which groups to wake: its payload is
`<tenant id hex>:<run id hex or empty>`.

On with AGENTRT_LIVE_PG_NOTIFY (default: on PostgreSQL when no REDIS_URL is
set, where the channel layer is in-memory and a worker's wake-up could not
reach a web process); never on SQLite.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection

CHANNEL = "agentrt_live"


def enabled() -> bool:
    return bool(getattr(settings, "AGENTRT_LIVE_PG_NOTIFY", False)) and connection.vendor == "postgresql"


def payload(run_id: Any, tenant_id: Any) -> str:
    run = UUID(str(run_id)).hex if run_id is not None else ""
    return f"{UUID(str(tenant_id)).hex}:{run}"


def returning(run_id: Any, tenant_id: Any) -> tuple[str, list[Any]]:
    """What the counter UPDATE's RETURNING list gains (SQL, parameters):
    nothing when the notification is off."""
    if not enabled():
        return "", []
    return ", pg_notify(%s, %s)", [CHANNEL, payload(run_id, tenant_id)]
