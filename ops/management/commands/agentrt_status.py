"""`manage.py agentrt_status [--json]`: the fleet at a glance."""

import json

from django.core.management.base import BaseCommand

from ops.fleet import fleet_snapshot


def _age(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


class Command(BaseCommand):
    help = (
        "Print the fleet at a glance: queue, oldest queued, live workers (every worker process of the qcluster nodes "
        "up now, idle or busy), runs by status, pending approvals."
    )

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="one JSON object instead of text")

    def handle(self, *args, **options):
        s = fleet_snapshot()
        if options["json"]:
            self.stdout.write(json.dumps(s, sort_keys=True))
            return
        q = s["queue"]
        lines = [
            f"queue            {q['depth']} queued, oldest {_age(q['oldest_age_seconds']) if q['depth'] else '-'}",
            f"live workers     {s['live_workers']} on {s['nodes']} node{'s' if s['nodes'] != 1 else ''}"
            f" ({s['busy_workers']} busy, holding {s['leased_runs']} lease{'s' if s['leased_runs'] != 1 else ''})",
            "runs by status   " + ", ".join(f"{k} {v}" for k, v in s["runs_by_status"].items()),
        ]
        pending = sum(a["pending"] for a in s["approvals"].values())
        if pending:
            kinds = ", ".join(
                f"{k} {a['pending']} (oldest {_age(a['oldest_age_seconds'])})"
                for k, a in sorted(s["approvals"].items())
                if a["pending"]
            )
            lines.append(f"approvals        {pending} pending: {kinds}")
        else:
            lines.append("approvals        0 pending")
        self.stdout.write("\n".join(lines))
