"""Hand-written reads on the paths that run per step or per request: a claimed run in one read, a
model instance from a row, an agent's latest version, a tenant's active runs under its lock."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.contrib.auth import get_user_model
from django.db import DEFAULT_DB_ALIAS, connection, connections

from runs.models import TERMINAL, Run
from runs.store.cursor import is_pg, sql_uuid, statement_cursor
from runs.store.json_text import parsed


def claimed_run(run_id: UUID) -> Run:
    """A claimed run as its execution starts, in one read: the row, its
    agent's name (`agent_name`), the definition of the version it is pinned
    to (`pinned_definition`; None when that row is gone), its principal's
    username (`principal_username`) and its tenant's allow-lists as they are
    now (`allowed_tools`, `allowed_endpoints`; None: all). Hand-written
    because each ORM read here was a round trip and about half a millisecond
    of query building between a run's claim and its first model call."""
    user_table = get_user_model()._meta.db_table
    rows: list[Run] = list(
        Run.objects.raw(
            "SELECT r.*, a.name AS agent_name, v.definition AS pinned_definition,"
            " u.username AS principal_username,"
            " t.allowed_tools AS allowed_tools, t.allowed_endpoints AS allowed_endpoints"
            " FROM runs r JOIN agents a ON a.id = r.agent_id"
            " JOIN tenants t ON t.id = r.tenant_id"
            " LEFT JOIN agent_versions v ON v.agent_id = r.agent_id AND v.version = r.agent_version"
            f" LEFT JOIN {connection.ops.quote_name(user_table)} u ON u.id = r.principal_user_id"
            " WHERE r.id = %s",
            [sql_uuid(run_id)],
        )
    )
    if not rows:
        raise Run.DoesNotExist(f"no run {run_id}")
    row = rows[0]
    row.pinned_definition = parsed(row.pinned_definition)  # no field converts an extra column
    row.allowed_tools = parsed(row.allowed_tools)
    row.allowed_endpoints = parsed(row.allowed_endpoints)
    return row


def model_from_row(model: Any, values: Iterable[Any], alias: str = DEFAULT_DB_ALIAS) -> Any:
    """An instance of `model` from a hand-written read of its concrete
    columns, in their order (`columns_of`), converted as the ORM converts
    them (JSON text, SQLite's UUIDs and booleans)."""
    db = connections[alias]
    fields = model._meta.concrete_fields
    converted = []
    for field, value in zip(fields, values, strict=True):
        col = field.get_col(model._meta.db_table)
        for convert in db.ops.get_db_converters(col) + field.get_db_converters(db):
            value = convert(value, col, db)
        converted.append(value)
    return model.from_db(alias, [f.attname for f in fields], converted)


def columns_of(model: Any, prefix: str) -> str:
    return ", ".join(f"{prefix}.{connection.ops.quote_name(f.column)}" for f in model._meta.concrete_fields)


@dataclass(frozen=True)
class LatestVersion:
    agent_id: UUID
    version: str
    definition: dict[str, Any]


def latest_version(tenant_id: UUID, agent_name: str) -> LatestVersion | None:
    """The latest version of the tenant's agent `agent_name` (None: no such
    agent, or its latest version's row is gone), in one hand-written,
    prepared read: the ORM's joined read cost about 2 ms of query building
    and planning on the submit's path, before its transaction."""
    with statement_cursor() as cursor:
        cursor.execute(
            "SELECT a.id, v.version, v.definition FROM agents a"
            " JOIN agent_versions v ON v.agent_id = a.id AND v.version = a.latest_version"
            " WHERE a.tenant_id = %s AND a.name = %s",
            [sql_uuid(tenant_id), agent_name],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    definition = parsed(row[2])
    agent_id = row[0] if isinstance(row[0], UUID) else UUID(str(row[0]))  # SQLite: hex text
    return LatestVersion(agent_id=agent_id, version=row[1], definition=definition)


def active_runs_and_quota(tenant_id: UUID) -> tuple[int, int | None]:
    """Inside the submit's transaction: lock the tenant's row, then count its
    active runs; returns (active, the tenant's own quota or None). The row
    lock serializes concurrent submits of one tenant, and the count is a
    statement of its own so that it sees (READ COMMITTED: a snapshot taken
    after the lock is granted) the runs of the submit it waited for. FOR NO
    KEY UPDATE: it does not block the FOR KEY SHARE that inserts referencing
    the tenant take. Hand-written: two ORM reads cost about 3 ms of query
    building per submit."""
    tenant = sql_uuid(tenant_id)
    terminal = ", ".join(f"'{status}'" for status in sorted(TERMINAL))
    with statement_cursor() as cursor:  # prepared once per connection
        cursor.execute(
            "SELECT max_active_runs FROM tenants WHERE id = %s" + (" FOR NO KEY UPDATE" if is_pg() else ""),
            [tenant],
        )
        row = cursor.fetchone()
        cursor.execute(f"SELECT count(*) FROM runs WHERE tenant_id = %s AND status NOT IN ({terminal})", [tenant])
        return cursor.fetchone()[0], row[0] if row else None
