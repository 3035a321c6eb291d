"""Reads in the REST shapes (docs/rest.md)."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Prefetch, QuerySet
from django.db.models.fields.json import KeyTextTransform

from runs.models import Event, Run
from runs.services.retrying import retryable

USAGE_KEYS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "reasoning_tokens",
    "cost_usd",
    "model_calls",
    "tool_calls",
    "steps",
)
FAILURE_KEYS = ("reason", "error_class", "message", "step_number", "attempt_number", "occurred_at")


def _iso(dt) -> str | None:
    return dt.isoformat().replace("+00:00", "Z") if dt else None


def run_to_dict(run: Run) -> dict[str, Any]:
    usage = run.usage or {}
    return {
        "id": str(run.id),
        "session": str(run.session_id),
        "agent": run.agent.name,
        "agent_version": run.agent_version,
        "status": run.status,
        "failure": {k: run.failure.get(k) for k in FAILURE_KEYS} if run.failure else None,
        "usage": {k: usage.get(k, 0.0 if k == "cost_usd" else 0) for k in USAGE_KEYS},
        "step_count": run.step_count,
        "final_message": run.final_message,
        "result": run.result,
        "parent": str(run.parent_id) if run.parent_id else None,
        "children": run_children(run),
        "forked_from": {"run": str(run.forked_from_id), "step": run.forked_from_step} if run.forked_from_id else None,
        "forks": run_forks(run),
        "replay_of": str(run.replay_of_id) if run.replay_of_id else None,
        "cancel_requested_at": _iso(run.cancel_requested_at),
        "retryable": retryable(run),
        "created_at": _iso(run.created_at),
        "updated_at": _iso(run.updated_at),
    }


def run_children(run: Run) -> list[dict[str, Any]]:
    """The child runs `run` started, in the order of its calls:
    `{"id", "agent", "status"}` each. Read from the list's prefetch
    (`with_children`) when there is one, else in one query."""
    prefetched = getattr(run, "_prefetched_objects_cache", {}).get("children")
    if prefetched is not None:
        rows = [(c.id, c.agent.name, c.status, c.created_at) for c in prefetched]
    else:
        rows = list(Run.objects.filter(parent_id=run.id).values_list("id", "agent__name", "status", "created_at"))
    rows.sort(key=lambda r: (r[3], str(r[0])))
    return [{"id": str(rid), "agent": agent, "status": status} for rid, agent, status, _ in rows]


def run_forks(run: Run) -> list[dict[str, Any]]:
    """The runs forked from `run`, oldest first: `{"id", "step", "status",
    "agent_version"}` each (from the list's prefetch when there is one)."""
    prefetched = getattr(run, "_prefetched_objects_cache", {}).get("forks")
    if prefetched is not None:
        rows = [(f.id, f.forked_from_step, f.status, f.agent_version, f.created_at) for f in prefetched]
    else:
        rows = list(
            Run.objects.filter(forked_from_id=run.id).values_list(
                "id", "forked_from_step", "status", "agent_version", "created_at"
            )
        )
    rows.sort(key=lambda r: (r[4], str(r[0])))
    return [{"id": str(rid), "step": step, "status": status, "agent_version": v} for rid, step, status, v, _ in rows]


def with_children(queryset: QuerySet) -> QuerySet:
    """`queryset` of runs with their children (and the children's agents) and their forks fetched in two
    more queries."""
    return queryset.prefetch_related(Prefetch("children", queryset=Run.objects.select_related("agent")), "forks")


def event_to_dict(event: Event) -> dict[str, Any]:
    return {
        "sequence": event.sequence,
        "type": event.type,
        "run": str(event.run_id) if event.run_id else None,
        "payload": event.payload,
        "occurred_at": _iso(event.occurred_at),
    }


def run_events(*, run: Run, after: int = 0, limit: int = 500) -> tuple[list[dict[str, Any]], int | None]:
    """Events of the run after sequence `after` (exclusive), and the next cursor."""
    rows = list(Event.objects.filter(run_id=run.id, sequence__gt=after).order_by("sequence")[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return [event_to_dict(e) for e in rows], (rows[-1].sequence if more and rows else None)


def tool_uncertain_counts(*, tenant_id=None) -> dict[str, int]:
    """`agent_tool_uncertain_total{tool}` until a metrics exporter
    exists: how many tool calls ended `uncertain`, by tool. Read from the
    append-only event log (`tool.call.failed` with `outcome: "uncertain"`),
    so the count is durable and never goes down when an approved re-run later
    succeeds on the same invocation row."""

    qs = Event.objects.filter(type="tool.call.failed", payload__outcome="uncertain")
    if tenant_id is not None:
        qs = qs.filter(tenant_id=tenant_id)
    rows = qs.annotate(tool=KeyTextTransform("tool", "payload")).values("tool").annotate(n=Count("id")).order_by("tool")
    return {r["tool"]: r["n"] for r in rows}
