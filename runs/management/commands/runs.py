"""`manage.py runs list|show|events|cancel|retry`: the runs of a tenant from the
command line, as the user `--as` names (runs/management/cli.py: scoping,
exit codes, output)."""

from __future__ import annotations

import json
import re
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_datetime

from approvals.selectors import approval_card
from runs.domain.events import EventType
from runs.errors import RunError
from runs.management.cli import (
    EXIT_CODES_HELP,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    acting_user,
    card_lines,
    cli_error,
    common_options,
    emit_error_json,
    emit_json,
    refusal,
    safe,
    table,
)
from runs.models import Run
from runs.services import run_get, scoping
from runs.services.lifecycle import run_cancel, run_retry
from runs.services.run_list import (
    FILTER_PARAMS,
    MAX_PAGE_SIZE,
    PAGE_SIZE,
    STATUSES,
    WAITING_ON,
    duration_text,
    run_filters_from,
    run_page,
    run_rows,
    runs_filtered,
    waiting_on,
    with_tenants,
)
from runs.services.selectors import run_events, run_to_dict, with_children

# The options of `runs list` by the filter each sets (an error names the option the operator typed).
FILTER_OPTIONS = {
    "status": "--status",
    "agent": "--agent",
    "waiting_on": "--waiting-on",
    "tenant": "--tenant",
    "since": "--since",
    "created_after": "--created-after",
    "created_before": "--created-before",
    "q": "--search",
    "cursor": "--cursor",
}
CANCEL_EVENTS = sorted(
    t.value for t in (EventType.RUN_CANCEL_REQUESTED, EventType.RUN_CANCELLED, EventType.RUN_CANCEL_TOO_LATE)
)
_HEXISH = re.compile(r"^[0-9a-fA-F-]{4,36}$")


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError("not a number") from None
    if not 1 <= value <= MAX_PAGE_SIZE:
        raise ValueError(f"from 1 to {MAX_PAGE_SIZE}")
    return value


class Command(BaseCommand):
    requires_system_checks: list[str] = []  # an operator's quick read; `manage.py check` is the deploy's
    help = (
        "List, show, follow and act on runs as a user (--as): list [filters], show RUN, events RUN, "
        "cancel RUN, retry RUN. RUN is a run's id, or the short id the pages show (its last characters). "
        + EXIT_CODES_HELP
        + "."
    )

    def add_arguments(self, parser):
        common = common_options()
        sub = parser.add_subparsers(
            dest="action", required=True, metavar="{list,show,events,cancel,retry}", help="what to do (each has --help)"
        )

        p = sub.add_parser(
            "list",
            parents=[common],
            help="runs newest first, filtered and searched as on the runs page",
            description="Runs newest first (a page at a time; --cursor for the next). " + EXIT_CODES_HELP,
        )
        p.add_argument(
            "--status", action="append", metavar="STATUS", help=f"{FILTER_PARAMS['status']} Of {', '.join(STATUSES)}."
        )
        p.add_argument("--agent", metavar="NAME", help=FILTER_PARAMS["agent"])
        p.add_argument("--waiting-on", choices=WAITING_ON, help=FILTER_PARAMS["waiting_on"])
        p.add_argument("--tenant", metavar="NAME", help=FILTER_PARAMS["tenant"])
        p.add_argument("--since", metavar="AGE", help=FILTER_PARAMS["since"])
        p.add_argument("--created-after", metavar="TIME", help=FILTER_PARAMS["created_after"])
        p.add_argument("--created-before", metavar="TIME", help=FILTER_PARAMS["created_before"])
        p.add_argument("--search", "-q", metavar="TEXT", help=FILTER_PARAMS["q"])
        p.add_argument(
            "--limit",
            type=_limit,
            default=PAGE_SIZE,
            metavar="N",
            help=f"runs per page, 1 to {MAX_PAGE_SIZE} (default {PAGE_SIZE})",
        )
        p.add_argument("--cursor", metavar="CURSOR", help="the page after (or before) the one that printed it")

        p = sub.add_parser(
            "show",
            parents=[common],
            help="one run: status, usage, what it waits on, its approvals and who decided them, its cancel",
            description="One run, with its approvals (pending: the card and its request hash) and its cancel. "
            + EXIT_CODES_HELP,
        )
        p.add_argument("run", metavar="RUN", help="the run's id, or the short id the pages show")

        p = sub.add_parser(
            "events",
            parents=[common],
            help="a run's events in order, with their times and the time since the one before",
            description="A run's events after a sequence number (exclusive), in order. " + EXIT_CODES_HELP,
        )
        p.add_argument("run", metavar="RUN", help="the run's id, or the short id the pages show")
        p.add_argument("--after", type=int, default=0, metavar="N", help="only events after sequence N (default 0)")
        p.add_argument("--limit", type=int, default=None, metavar="M", help="at most M events, 1 to 500 (default: all)")

        p = sub.add_parser(
            "cancel",
            parents=[common],
            help="cancel a run of your own tenant (recorded with who, via cli, and the reason)",
            description="Cancel a run: a queued or waiting run ends at once, a running one stops at its next "
            "observation point; a finished run is a conflict (run_terminal, exit 4). " + EXIT_CODES_HELP,
        )
        p.add_argument("run", metavar="RUN", help="the run's id, or the short id the pages show")
        p.add_argument(
            "--reason", default=None, metavar="TEXT", help="why (kept with the request; at most 2000 characters)"
        )

        p = sub.add_parser(
            "retry",
            parents=[common],
            help="retry a run of your own tenant that failed for a transient reason (a new attempt of the same run)",
            description="Retry a run that failed for a transient reason (dependency_unavailable, internal_error, "
            "max_attempts_exceeded): a new attempt of the same run, from its last checkpoint, recorded with who and "
            "via cli; a recorded tool result is never sent again, and a side effect whose outcome is unknown is "
            "asked about first. A run that did not fail (run_not_failed), failed for another reason, is a child "
            "run or is past its deadline (run_not_retryable, naming why) is a conflict (exit 4). " + EXIT_CODES_HELP,
        )
        p.add_argument("run", metavar="RUN", help="the run's id, or the short id the pages show")

    def handle(self, *args, **opts):
        self.json = opts["json"]
        try:
            user = acting_user(opts["as_user"])
            getattr(self, "do_" + opts["action"])(user, opts)
        except CommandError as error:
            if self.json:
                emit_error_json(error)
            raise

    def out(self, value: Any, text: str) -> None:
        if self.json:
            emit_json(self.stdout, value)
        else:
            self.stdout.write(text)

    # -- the subcommands ------------------------------------------------------------------------------

    def do_list(self, user, opts) -> None:
        params = {
            "status": opts["status"] or [],
            "agent": opts["agent"],
            "waiting_on": opts["waiting_on"],
            "tenant": opts["tenant"],
            "since": opts["since"],
            "created_after": opts["created_after"],
            "created_before": opts["created_before"],
            "q": opts["search"],
        }
        try:
            filters = run_filters_from({k: v for k, v in params.items() if v is not None})
            every_tenant = scoping.sees_every_tenant(user)
            qs = with_children(runs_filtered(user=user, filters=filters))
            if every_tenant:
                qs = with_tenants(qs)
            page = run_page(qs, cursor=opts["cursor"], limit=opts["limit"])
        except RunError as exc:
            raise refusal(exc, options=FILTER_OPTIONS) from None
        rows = run_rows(page.runs, with_tenant=every_tenant)
        lines = table(
            [
                [
                    r["id"],
                    safe(r["agent"]),
                    r["status"],
                    r["waiting_label"] or "-",
                    str(r["step_count"]),
                    r["cost"],
                    duration_text(r["duration_seconds"]) or "-",
                    r["created_at"],
                    *([safe(r["tenant"])] if every_tenant else []),
                ]
                for r in rows
            ],
            [
                "ID",
                "AGENT",
                "STATUS",
                "WAITING",
                "STEPS",
                "COST",
                "DURATION",
                "CREATED",
                *(["TENANT"] if every_tenant else []),
            ],
        )
        if not rows:
            lines = "no runs match"
        if page.older:
            lines += f"\nmore: --cursor {page.older}"
        self.out({"results": rows, "next_cursor": page.older, "previous_cursor": page.newer}, lines)

    def do_show(self, user, opts) -> None:
        run = self.run_of(user, opts["run"])
        out = run_to_dict(run)
        waits = waiting_on([run]).get(run.id) or {}
        out["waiting_on"] = waits.get("on")
        approvals = [
            approval_card(a)
            for a in run.approvals.select_related("run__agent", "decided_by").order_by("created_at", "id")
        ]
        out["approvals"] = approvals
        out["cancel"] = self.cancel_of(run)
        u = out["usage"]
        lines = [
            f"run        {out['id']}",
            f"agent      {safe(out['agent'])} ({out['agent_version'][:10]})",
            f"status     {out['status']}" + (f", waiting on {waits['on'].replace('_', ' ')}" if waits else ""),
            f"created    {out['created_at']}",
            f"updated    {out['updated_at']}",
            f"steps      {out['step_count']}",
            f"tokens     {u['input_tokens']} in / {u['output_tokens']} out ({u['cache_read_input_tokens']} cached)",
            f"calls      {u['model_calls']} model / {u['tool_calls']} tool",
            f"cost       {float(u['cost_usd'] or 0):.4f} USD",
        ]
        if out["parent"]:
            lines.append(f"parent     {out['parent']}")
        for child in out["children"]:
            lines.append(f"child      {child['id']} {safe(child['agent'])} {child['status']}")
        if out["failure"]:
            f = out["failure"]
            lines.append(f"failure    {safe(f['reason'])}: {safe(f['message'])}")
        if out["cancel"]:
            c = out["cancel"]
            lines.append(
                f"cancel     {c['type']} by {safe(c.get('by') or '?')} via {safe(c.get('via') or '?')} at {c['at']}"
                + (f": {safe(c['reason'])}" if c.get("reason") else "")
            )
        if out["final_message"] is not None:
            lines.append("answer     " + safe(out["final_message"], multiline=True))
        for card in approvals:
            lines.append("")
            lines.extend(card_lines(card))
        self.out(out, "\n".join(lines))

    def do_events(self, user, opts) -> None:
        run = self.run_of(user, opts["run"])
        limit = opts["limit"]
        if limit is not None and not 1 <= limit <= 500:
            raise cli_error("invalid", "--limit: from 1 to 500", exit_code=EXIT_USAGE)
        if opts["after"] < 0:
            raise cli_error("invalid", "--after: 0 or more", exit_code=EXIT_USAGE)
        events, after, next_after = [], opts["after"], None
        while True:
            page, next_after = run_events(run=run, after=after, limit=limit or 500)
            events += page
            if limit is not None or next_after is None:
                break
            after = next_after
        lines, previous = [], None
        for e in events:
            gap = event_gap(previous, e["occurred_at"])
            previous = e["occurred_at"]
            lines.append(f"#{e['sequence']:<5} {e['occurred_at']}  {gap:>12}  {e['type']:<28} {safe(summary(e))}")
        self.out({"results": events, "next_after": next_after}, "\n".join(lines) or "no events")

    def do_cancel(self, user, opts) -> None:
        run = self.run_of(user, opts["run"], acting=True)
        try:
            after = run_cancel(run=run, by=user.get_username(), via="cli", reason=opts["reason"])
        except RunError as exc:
            raise refusal(exc, options={"reason": "--reason"}) from None
        now = run_get(tenant=None, run_id=run.id)
        text = {
            "CANCELLED": f"run {run.id} cancelled",
            "RUNNING": f"run {run.id}: cancel requested; it stops at its next observation point",
            "WAITING_FOR_APPROVAL": f"run {run.id}: cancel requested; it waits on a call whose outcome is unknown "
            "and ends as soon as someone confirms or rejects it",
        }.get(after, f"run {run.id}: {after}")
        self.out(run_to_dict(now), text)

    def do_retry(self, user, opts) -> None:
        run = self.run_of(user, opts["run"], acting=True)
        try:
            after = run_retry(run=run, by=user.get_username(), via="cli")
        except RunError as exc:
            raise refusal(exc) from None
        retried = run_get(tenant=None, run_id=run.id)
        text = {
            "QUEUED": f"run {run.id}: retried; it continues from its last checkpoint (recorded tool results are "
            "not sent again)",
            "WAITING_FOR_APPROVAL": f"run {run.id}: retried; a side effect of the failed attempt has an unknown "
            "outcome, so the run waits until someone confirms whether it took effect (approvals list)",
        }.get(after, f"run {run.id}: retried, now {after}")
        self.out(run_to_dict(retried), text)

    # -- helpers ---------------------------------------------------------------------------------------

    def run_of(self, user, ref: str, *, acting: bool = False) -> Run:
        """The run `ref` names (an id, or a short id / prefix of one run the user sees); 404 as exit 3."""
        key = scoping.as_uuid(ref)
        if key is None and _HEXISH.match(ref or ""):
            matches = list(
                runs_filtered(user=user, filters=run_filters_from({"q": ref})).values_list("id", flat=True)[:6]
            )
            bare = ref.replace("-", "").lower()
            matches = [m for m in matches if m.hex.startswith(bare) or m.hex.endswith(bare)]
            if len(matches) > 1:
                shown = ", ".join(str(m) for m in matches[:5])
                raise cli_error("ambiguous", f"{ref} names more than one run: {shown}", exit_code=EXIT_USAGE)
            key = matches[0] if matches else None
        try:
            return (scoping.run_actionable if acting else scoping.run_visible)(user, key)
        except RunError:
            raise cli_error(
                "not_found", f"no run {ref} that {user.get_username()} may see", exit_code=EXIT_NOT_FOUND
            ) from None

    def cancel_of(self, run: Run) -> dict[str, Any] | None:
        """The latest cancel request (or its end) the run's events record: who, via what, why, when."""
        rows = run.events.filter(type__in=CANCEL_EVENTS).order_by("-sequence").values("type", "payload", "occurred_at")
        row = rows.first()
        if row is None:
            return None
        payload = row["payload"] or {}
        return {
            "type": row["type"],
            "by": payload.get("by"),
            "via": payload.get("via"),
            "reason": payload.get("reason"),
            "at": row["occurred_at"].isoformat().replace("+00:00", "Z"),
        }


def event_gap(previous: str | None, current: str) -> str:
    """`+1.2 s`: the time since the event before (nothing for the first)."""
    if previous is None:
        return ""
    a, b = parse_datetime(previous), parse_datetime(current)
    if a is None or b is None:
        return ""
    return "+" + duration_text((b - a).total_seconds())


def summary(event: dict[str, Any]) -> str:
    """One line of what an event says (its payload, compact; long ones cut)."""
    p = event.get("payload") or {}
    text = json.dumps(p, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= 160 else text[:159] + "…"
