"""`manage.py purge_runs --tenant T --before DATE [--dry-run]`: remove the
detail of tenant T's ended runs last written before DATE (what retention
removes: maintenance/retention.py), a batch of runs per transaction; the run
rows stay. Runs that have not ended are never touched. `--dry-run` counts
what would go and writes nothing. A bad option is named, exits 1, and
nothing is deleted."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, time
from uuid import UUID

from django.core.management.base import BaseCommand, CommandError

from maintenance.retention import count_detail, remove_detail
from runs.models import Tenant


def parse_before(text: str) -> datetime:
    """`2026-11-01` (midnight UTC) or an ISO 8601 time with its offset (`2026-11-01T12:00:00+01:00`)."""
    try:
        if len(text) == 10:
            return datetime.combine(date.fromisoformat(text), time(0), tzinfo=UTC)
        at = datetime.fromisoformat(text)
    except ValueError:
        raise CommandError(
            f"--before: {text!r} is not a date: give YYYY-MM-DD (midnight UTC) or an ISO 8601 time with an offset"
        ) from None
    if at.tzinfo is None:
        raise CommandError(f"--before: {text!r} has no UTC offset: add one (e.g. {text}+00:00), or give YYYY-MM-DD")
    return at


def find_tenant(text: str) -> Tenant:
    """A tenant by its name, or by its id."""
    tenant = Tenant.objects.filter(name=text).first()
    if tenant is None:
        try:
            tenant = Tenant.objects.filter(id=UUID(text)).first()
        except ValueError:
            tenant = None
    if tenant is None:
        raise CommandError(f"--tenant: no tenant named {text!r} (give a tenant's name or id)")
    return tenant


class Command(BaseCommand):
    help = (
        "Remove the detail (events, tool calls, approvals, model calls, checkpoints, finished deliveries) of a "
        "tenant's ended runs last written before a date; the run rows stay. Runs not ended are never touched."
    )

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="the tenant's name (or id)")
        parser.add_argument(
            "--before",
            required=True,
            metavar="DATE",
            help="runs that ended before this: YYYY-MM-DD (midnight UTC) or an ISO 8601 time with an offset",
        )
        parser.add_argument("--dry-run", action="store_true", help="count what would be removed; remove nothing")

    def handle(self, *args, **opts):
        cutoff = parse_before(opts["before"])
        tenant = find_tenant(opts["tenant"])
        if opts["dry_run"]:
            counts = count_detail(tenant.id, cutoff)
            verb = "would remove"
        else:
            counts = remove_detail(tenant.id, cutoff)
            verb = "removed"
        rows = ", ".join(f"{n} {name}" for name, n in counts.rows.items())
        self.stdout.write(
            f"tenant {tenant.name}: {verb} the detail of {counts.runs} ended runs last written before "
            f"{cutoff.isoformat()} ({rows})"
        )
        self.stdout.write(
            json.dumps(
                {"tenant": tenant.name, "before": cutoff.isoformat(), "dry_run": opts["dry_run"], **counts.as_json()}
            )
        )
