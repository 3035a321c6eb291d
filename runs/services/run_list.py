"""The runs list an operator works with: filters, search and keyset paging,
shared by `GET /api/runs/`, the live runs page and `manage.py runs list`.

Every read starts from `scoping.runs_visible_to(user)`; a filter only narrows
it, so no filter, search or cursor reaches another tenant's runs.

What each filter costs on a tenant with many runs (PostgreSQL):

- none, a time range: `runs_tenant_created_idx (tenant, created_at DESC)`,
  walked in order and stopped after a page;
- `status` of live runs (and `waiting_on`, which implies a waiting status):
  `runs_active_tenant_idx`, which holds only the runs that have not ended;
  `FAILED` / `CANCELLED`: `runs_tenant_ended_badly_idx`, which holds only
  those; `COMPLETED`, most of a tenant's runs, the (tenant, created) walk;
- `agent`: the name is resolved to the agent's id first (one row of a small
  table), then `runs_agent_created_idx (agent, created_at DESC)`;
- `q`: an id prefix is a range of the primary key and an agent name a list
  of agent ids (both over every run); the input text and the short id shown
  on the page (the id's last characters) are matched only among the
  SEARCH_WINDOW most recent runs that pass the other filters, a bounded
  ILIKE, never a scan of the tenant's history.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from django.core.exceptions import EmptyResultSet
from django.db import connection
from django.db.models import CharField, Exists, OuterRef, Q, QuerySet, Value
from django.db.models.functions import Cast, Replace
from django.utils.dateparse import parse_date, parse_datetime
from pydantic import BaseModel, ConfigDict

from approvals.models import Approval
from runs.clock import CLOCK
from runs.domain.values import RunStatus
from runs.errors import InvalidInput
from runs.models import TERMINAL, Event, Run
from runs.services import scoping
from runs.services.retrying import retryable
from runs.services.selectors import USAGE_KEYS, run_to_dict

SEARCH_WINDOW = 5_000  # the most recent runs (after the other filters) whose input text `q` reads
PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
SHORT_ID = 8  # characters of the id's random tail shown on the page (a UUIDv7 starts with its timestamp)
INPUT_PREVIEW = 120
MIN_ID_SEARCH = 4  # hex digits before `q` is also read as an id prefix or tail
WAITING_ON = ("approval", "user", "child_runs")
WAITING_LABELS = {"approval": "approval", "user": "user", "child_runs": "child runs"}
STATUSES = tuple(s.value for s in RunStatus)
_SINCE = re.compile(r"^([1-9][0-9]{0,5})([smhd])$")
_SINCE_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
_HEX = re.compile(r"^[0-9a-f]+$")
# What the page and the API accept, and what each means (the OpenAPI parameters and `runs list --help` say the same).
FILTER_PARAMS = {
    "status": "Only runs in these statuses (comma-separated, or the parameter repeated).",
    "agent": "Only runs of the agent with this name.",
    "waiting_on": "Only runs waiting on an `approval`, on the `user` (ask_user) or on their `child_runs`.",
    "tenant": "Only runs of the tenant with this name (for a superuser, who sees every tenant; a member's own "
    "tenant lists its runs, any other name nothing).",
    "created_after": "Only runs created at or after this time (ISO 8601; a date means its midnight UTC).",
    "created_before": "Only runs created before this time (ISO 8601; a date means its midnight UTC).",
    "since": "Only runs created in the last N seconds, minutes, hours or days: `30m`, `24h`, `7d`.",
    "q": f"Search: an id prefix, the short id the pages show (its last characters), an agent's name, or text of "
    f"the input; the input and short ids are searched among the {SEARCH_WINDOW:,} most recent runs that pass "
    f"the other filters.",
}


class RunFilters(BaseModel):
    """What narrows a runs list (each None: not narrowed)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    statuses: tuple[str, ...] | None = None
    agent: str | None = None
    waiting_on: str | None = None
    tenant: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    q: str | None = None

    def query(self) -> dict[str, str]:
        """The filters as query parameters (links to another page keep them)."""
        out: dict[str, str] = {}
        if self.statuses:
            out["status"] = ",".join(self.statuses)
        for name in ("agent", "waiting_on", "tenant", "q"):
            value = getattr(self, name)
            if value:
                out[name] = value
        for name in ("created_after", "created_before"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value.isoformat().replace("+00:00", "Z")
        return out


def _bad(field: str, message: str) -> InvalidInput:
    return InvalidInput(f"{field}: {message}", fields={field: [message]})


def _values(params: Mapping[str, Any], name: str) -> list[str]:
    """Every value given for `name`: a repeated parameter or a list, each split on commas."""
    getlist = getattr(params, "getlist", None)
    raw = getlist(name) if getlist is not None else params.get(name)
    if raw is None:
        return []
    if isinstance(raw, str):
        raw = [raw]
    out: list[str] = []
    for value in raw:
        if not isinstance(value, str):
            raise _bad(name, "must be text")
        out.extend(part.strip() for part in value.split(",") if part.strip())
    return out


def _one(params: Mapping[str, Any], name: str, max_length: int) -> str | None:
    getlist = getattr(params, "getlist", None)
    raw = getlist(name) if getlist is not None else params.get(name)
    if isinstance(raw, list):
        if len(raw) > 1:
            raise _bad(name, "give it once")
        raw = raw[0] if raw else None
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise _bad(name, "must be text")
    value = raw.strip()
    if not value:
        return None
    if len(value) > max_length:
        raise _bad(name, f"at most {max_length} characters")
    if "\x00" in value:
        raise _bad(name, "NUL characters are not allowed")
    return value


def _moment(name: str, text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        moment = parse_datetime(text)
        if moment is None:
            day = parse_date(text)
            moment = datetime(day.year, day.month, day.day) if day is not None else None
    except ValueError:
        moment = None
    if moment is None:
        raise _bad(name, "must be an ISO 8601 date or time, e.g. 2026-12-03T09:30:00Z")
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _given(params: Mapping[str, Any], *, blank: bool) -> dict[str, list[Any]]:
    """The filter parameters of `params` as lists of values. A blank value is
    refused naming its parameter, or with `blank` (a page's form, which sends
    every field) left out."""
    getlist = getattr(params, "getlist", None)
    out: dict[str, list[Any]] = {}
    for name in FILTER_PARAMS:
        raw = getlist(name) if getlist is not None else params.get(name)
        if raw is None or raw == []:
            continue
        values = list(raw) if isinstance(raw, list | tuple) else [raw]
        kept = [v for v in values if not (isinstance(v, str) and not v.strip())]
        if len(kept) < len(values) and not blank:
            raise _bad(name, "must not be blank")
        if kept:
            out[name] = kept
    return out


def run_filters_from(params: Mapping[str, Any], *, now: datetime | None = None, blank: bool = False) -> RunFilters:
    """The filters named in `params` (query parameters, or the CLI's options
    under the same names), checked: a value that is blank (unless `blank`),
    not one of the choices, not a time, or too long is InvalidInput naming the
    parameter."""
    params = _given(params, blank=blank)
    statuses = _values(params, "status")
    unknown = [s for s in statuses if s not in STATUSES]
    if unknown:
        raise _bad("status", f"unknown status {unknown[0]!r}; one of {', '.join(STATUSES)}")
    waiting_on = _one(params, "waiting_on", 20)
    if waiting_on is not None and waiting_on not in WAITING_ON:
        raise _bad("waiting_on", f"must be one of {', '.join(WAITING_ON)}")
    after = _moment("created_after", _one(params, "created_after", 64))
    before = _moment("created_before", _one(params, "created_before", 64))
    since = _one(params, "since", 8)
    if since is not None:
        match = _SINCE.match(since)
        if match is None:
            raise _bad("since", "must be a number and a unit (s, m, h, d), e.g. 30m, 24h, 7d")
        start = (now or CLOCK.now()) - timedelta(**{_SINCE_UNITS[match.group(2)]: int(match.group(1))})
        after = max(after, start) if after is not None else start
    if after is not None and before is not None and before <= after:
        raise _bad("created_before", "must be later than created_after (or since)")
    return RunFilters(
        statuses=tuple(dict.fromkeys(statuses)) or None,
        agent=_one(params, "agent", 100),
        waiting_on=waiting_on,
        tenant=_one(params, "tenant", 100),
        created_after=after,
        created_before=before,
        q=_one(params, "q", 200),
    )


def runs_filtered(*, user, filters: RunFilters) -> QuerySet:
    """The runs `user` may see that pass `filters` (unordered)."""
    qs = scoping.runs_visible_to(user)
    if filters.tenant:
        qs = scoping.tenant_named(qs, filters.tenant)
    qs = _narrow(qs, user, filters)
    if filters.q:
        qs = _search(qs, user, filters.q)
    return qs


def _narrow(qs: QuerySet, user, filters: RunFilters) -> QuerySet:
    if filters.statuses:
        qs = qs.filter(status__in=list(filters.statuses))
    if filters.agent:
        # The agent's id first: then the (agent, created) index serves the page in order.
        agents = scoping.agents_visible_to(user).filter(name=filters.agent)
        if filters.tenant:
            agents = scoping.tenant_named(agents, filters.tenant)
        ids = list(agents.values_list("id", flat=True)[:100])
        qs = qs.filter(agent_id__in=ids) if ids else qs.none()
    if filters.waiting_on == "user":
        qs = qs.filter(status=RunStatus.WAITING_FOR_USER.value)
    elif filters.waiting_on in ("approval", "child_runs"):
        pending = Exists(Approval.objects.filter(run_id=OuterRef("id"), status__unindexed="pending"))
        qs = qs.filter(status=RunStatus.WAITING_FOR_APPROVAL.value)
        qs = qs.filter(pending) if filters.waiting_on == "approval" else qs.exclude(pending)
    if filters.created_after is not None:
        qs = qs.filter(created_at__gte=filters.created_after)
    if filters.created_before is not None:
        qs = qs.filter(created_at__lt=filters.created_before)
    return qs


def _id_range(hexdigits: str) -> tuple[UUID, UUID]:
    return UUID(hexdigits.ljust(32, "0")), UUID(hexdigits.ljust(32, "f"))


def _search(qs: QuerySet, user, q: str) -> QuerySet:
    """`qs` narrowed to the runs `q` finds (see the module's docstring)."""
    text = q.lower()
    hexdigits = text.replace("-", "")
    as_id = len(hexdigits) >= MIN_ID_SEARCH and len(hexdigits) <= 32 and bool(_HEX.match(hexdigits))
    found = Q(pk__in=[])
    if as_id:
        low, high = _id_range(hexdigits)
        found |= Q(id__gte=low, id__lte=high)
    agents = list(scoping.agents_visible_to(user).filter(name__icontains=q).values_list("id", flat=True)[:100])
    if agents:
        found |= Q(agent_id__in=agents)
    ids = _window_matches(qs, q, hexdigits if as_id else None)
    if ids:
        found |= Q(id__in=ids)
    return qs.filter(found)


def _like(text: str) -> str:
    """`text` as a LIKE pattern's literal part (its wildcards and the escape character escaped)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _window_matches(qs: QuerySet, q: str, tail: str | None) -> list[UUID]:
    """The ids of the SEARCH_WINDOW most recent runs of `qs` whose input holds `q` (any case) or whose id
    ends with `tail`. The window is a derived table, so the text is compared on its rows only: written as
    `id IN (window) AND input ILIKE`, the planner may instead compare the input of every run of every tenant
    (it estimates the match to be rare) and only then keep the window's."""
    bare = Replace(Cast("id", output_field=CharField()), Value("-"), Value(""))
    window = qs.order_by("-created_at").annotate(bare_id=bare).values("id", "input", "bare_id")[:SEARCH_WINDOW]
    try:
        sql, params = window.query.sql_with_params()
    except EmptyResultSet:  # narrowed to nothing already
        return []
    where = "UPPER(w.input) LIKE UPPER(%s) ESCAPE '\\'"
    args = [*params, f"%{_like(q)}%"]
    if tail:
        where += " OR LOWER(w.bare_id) LIKE %s ESCAPE '\\'"
        args.append(f"%{_like(tail)}")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT w.id FROM ({sql}) w WHERE {where}", args)
        return [key if isinstance(key, UUID) else UUID(str(key)) for (key,) in cursor.fetchall()]


# -- keyset paging --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    runs: list[Run]
    older: str | None  # the cursor of the next page (older runs), or None at the end
    newer: str | None  # the cursor of the previous page (newer runs), or None on the first


def _token(direction: str, run: Run) -> str:
    raw = json.dumps([direction, run.created_at.isoformat(), str(run.id)], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _position(cursor: str) -> tuple[str, datetime, UUID]:
    bad = _bad("cursor", "not a cursor this list gave out")
    if len(cursor) > 200:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        direction, at, run_id = json.loads(raw)
        moment = datetime.fromisoformat(at)
        key = UUID(run_id)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise bad from None
    if direction not in ("older", "newer") or moment.tzinfo is None:
        raise bad
    return direction, moment, key


def run_page(queryset: QuerySet, *, cursor: str | None = None, limit: int = PAGE_SIZE) -> Page:
    """One page of `queryset`, newest first, by (created_at, id): a cursor
    names the row a page starts after, so rows created meanwhile neither
    shift nor repeat a page (no OFFSET: each page is one index walk)."""
    limit = max(1, min(limit, MAX_PAGE_SIZE))
    if not cursor:
        rows = list(queryset.order_by("-created_at", "-id")[: limit + 1])
        return Page(rows[:limit], _token("older", rows[limit - 1]) if len(rows) > limit else None, None)
    direction, at, key = _position(cursor)
    if direction == "older":
        before = Q(created_at__lt=at) | Q(created_at=at, id__lt=key)
        rows = list(queryset.filter(before).order_by("-created_at", "-id")[: limit + 1])
        page = rows[:limit]
        older = _token("older", page[-1]) if len(rows) > limit else None
        return Page(page, older, _token("newer", page[0]) if page else None)
    after = Q(created_at__gt=at) | Q(created_at=at, id__gt=key)
    rows = list(queryset.filter(after).order_by("created_at", "id")[: limit + 1])
    page = rows[:limit][::-1]
    newer = _token("newer", page[0]) if len(rows) > limit else None
    return Page(page, _token("older", page[-1]) if page else None, newer)


# -- what a row shows -----------------------------------------------------------------------------------


def short_id(run_id: Any) -> str:
    """The last SHORT_ID hex digits of a run's id: random in a UUIDv7, whose first digits are its timestamp."""
    return str(run_id).replace("-", "")[-SHORT_ID:]


def cost_text(cost: Any) -> str:
    """A cost in USD with the same four decimals everywhere (0.0000, 0.0125, 1.5000)."""
    try:
        return f"{float(cost or 0):.4f}"
    except (TypeError, ValueError):
        return "0.0000"


def duration_text(seconds: float | None) -> str:
    """A duration as the pages write it (runs/static/runs/fmt.js): 850 ms, 12.3 s, 4 min 05 s, 2 h 03 min."""
    if seconds is None:
        return ""
    s = max(0.0, float(seconds))
    if s < 1:
        return f"{round(s * 1000)} ms"
    if s < 60:
        return f"{int(s * 10) / 10:.1f} s"
    total = int(s)
    if total < 3600:
        return f"{total // 60} min {total % 60:02d} s"
    if total < 86400:
        return f"{total // 3600} h {(total % 3600) // 60:02d} min"
    return f"{total // 86400} d {(total % 86400) // 3600} h"


def ago_text(moment: datetime | None, now: datetime | None = None) -> str:
    """How long ago `moment` was, as the pages write it: just now, 42 s ago, 5 min ago, 3 h ago, 2 d ago."""
    if moment is None:
        return ""
    s = max(0.0, ((now or CLOCK.now()) - moment).total_seconds())
    if s < 5:
        return "just now"
    if s < 60:
        return f"{int(s)} s ago"
    if s < 3600:
        return f"{int(s // 60)} min ago"
    if s < 86400:
        return f"{int(s // 3600)} h ago"
    return f"{int(s // 86400)} d ago"


def waiting_on(runs: Iterable[Run]) -> dict[Any, dict[str, str]]:
    """What each waiting run of `runs` waits on: `{"on": approval|user|child_runs, "kind": ...}` by run id
    (one query for the runs waiting for approval: a run with no pending approval waits on its child runs)."""
    runs = list(runs)
    for_approval = [r.id for r in runs if r.status == RunStatus.WAITING_FOR_APPROVAL.value]
    kinds: dict[Any, str] = {}
    if for_approval:
        rows = Approval.objects.filter(run_id__in=for_approval, status__unindexed="pending").order_by("created_at")
        for run_id, kind in rows.values_list("run_id", "kind"):
            kinds.setdefault(run_id, kind)
    out: dict[Any, dict[str, str]] = {}
    for r in runs:
        if r.status == RunStatus.WAITING_FOR_USER.value:
            out[r.id] = {"on": "user", "kind": ""}
        elif r.status == RunStatus.WAITING_FOR_APPROVAL.value:
            out[r.id] = {"on": "approval", "kind": kinds[r.id]} if r.id in kinds else {"on": "child_runs", "kind": ""}
    return out


def _iso(dt) -> str | None:
    return dt.isoformat().replace("+00:00", "Z") if dt else None


def run_row(run: Run, waiting: Mapping[str, str] | None, *, with_tenant: bool = False) -> dict[str, Any]:
    """A row of the runs list: the REST shape and what the page and the CLI show of it."""
    row = run_to_dict(run)
    ended = run.status in TERMINAL
    on = (waiting or {}).get("on")
    row.update(
        {
            "short_id": short_id(run.id),
            "waiting_on": on,
            "waiting_kind": (waiting or {}).get("kind") or None,
            "waiting_label": WAITING_LABELS.get(on or "", ""),
            "cost": cost_text(row["usage"]["cost_usd"]),
            "ended_at": _iso(run.updated_at) if ended else None,
            "duration_seconds": (run.updated_at - run.created_at).total_seconds() if ended else None,
            "input_preview": run.input[:INPUT_PREVIEW] + ("…" if len(run.input) > INPUT_PREVIEW else ""),
        }
    )
    if with_tenant:
        row["tenant"] = run.tenant.name
    return row


def run_summary(run: Run) -> dict[str, Any]:
    """What the run page keeps live beside its timeline: status, steps, usage and cost, times, and whether
    a cancel applies (not to a run that has ended, nor again once one is requested) and a retry does (a run
    that failed for a transient reason).

    The last event is read before the run's row, which `run` is read again from: the page replays events up
    to `last_sequence` as history and takes the status from here, so the status is never older than the
    history (an end committed between two reads is then either in both or after both, never in the history
    alone, where the page would not apply it). `run` is left holding the row read."""
    last_sequence = _last_sequence(run)
    run.refresh_from_db()
    given = run.usage or {}
    usage = {k: given.get(k, 0.0 if k == "cost_usd" else 0) for k in USAGE_KEYS}
    ended = run.status in TERMINAL
    return {
        "id": str(run.id),
        "status": run.status,
        "step_count": run.step_count,
        "usage": usage,
        "cost": cost_text(usage.get("cost_usd")),
        "created_at": _iso(run.created_at),
        "ended_at": _iso(run.updated_at) if ended else None,
        "duration_seconds": (run.updated_at - run.created_at).total_seconds() if ended else None,
        "cancel_requested_at": _iso(run.cancel_requested_at),
        "cancellable": not ended and run.cancel_requested_at is None,
        "retryable": retryable(run),
        "last_sequence": last_sequence,
    }


def _last_sequence(run: Run) -> int:
    """The run's last event so far (the page replays up to it as history)."""
    last = Event.objects.filter(run_id=run.id).order_by("-sequence").values_list("sequence", flat=True).first()
    return last or 0


def run_rows(runs: list[Run], *, with_tenant: bool = False) -> list[dict[str, Any]]:
    waits = waiting_on(runs)
    return [run_row(r, waits.get(r.id), with_tenant=with_tenant) for r in runs]


def with_tenants(queryset: QuerySet) -> QuerySet:
    """`queryset` with each run's tenant (for a superuser's rows, which name it)."""
    return queryset.select_related("tenant")


__all__ = [
    "FILTER_PARAMS",
    "Page",
    "RunFilters",
    "SEARCH_WINDOW",
    "ago_text",
    "cost_text",
    "duration_text",
    "run_filters_from",
    "run_page",
    "run_row",
    "run_rows",
    "run_summary",
    "runs_filtered",
    "short_id",
    "waiting_on",
    "with_tenants",
]
