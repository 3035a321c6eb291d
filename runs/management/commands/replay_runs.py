"""`manage.py replay_runs`: the regression check before publishing a version.

Replays a tenant's finished runs of one agent against a version (default:
its latest) — each replay calls the model for real and executes no tool
call (runs.services.lineage.run_replay) — waits for the replays to end, and
prints a table: each run and its replay (by their short ids, as the pages
show them) and how the replay ended (the same, diverged at which step and
why, or failed), then the totals. The replays are runs of the
tenant like any other, executed by the workers (start them with `qcluster`
or `make cluster`): they count against the tenant's quota, so at most
`--concurrency` are in flight at once, and a submit the quota refuses waits
for one of them to end. Exits 1 when any replay did not end the same."""

from __future__ import annotations

import re
from collections import Counter
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_date, parse_datetime

from runs.clock import CLOCK
from runs.errors import QuotaExceeded, RunError
from runs.models import Agent, Run
from runs.services import tenant_get
from runs.services.compare import replay_verdict
from runs.services.lineage import run_replay
from runs.services.run_list import short_id
from runs.services.waiting import RunWaitTimeout, wait_for_run

RELATIVE = re.compile(r"^([1-9][0-9]{0,5})([mhd])$")
UNITS = {"m": "minutes", "h": "hours", "d": "days"}


class Command(BaseCommand):
    help = (
        "Replay finished runs of an agent against a version and print how many ended the same, diverged (at "
        "which step) or failed. Replays execute no tool call; they need running workers. Exits 1 unless every "
        "replay ended the same."
    )

    def add_base_argument(self, parser, *args, **kwargs):
        if "--version" in args:  # here --version names the agent version, not Django's
            return
        super().add_base_argument(parser, *args, **kwargs)

    def add_arguments(self, parser):
        parser.add_argument("--agent", required=True, metavar="NAME", help="the agent whose runs are replayed")
        parser.add_argument(
            "--version",
            default="latest",
            metavar="V",
            help="the version to replay against: its id or version hash as the agents API shows it, or latest "
            "(default)",
        )
        parser.add_argument(
            "--since",
            default="7d",
            metavar="WHEN",
            help="runs created since then: an ISO date or time, or 30m / 12h / 7d ago (default: 7d)",
        )
        parser.add_argument("--tenant", default="demo", metavar="NAME", help="the runs' tenant (default: demo)")
        parser.add_argument(
            "--status",
            default="COMPLETED,FAILED",
            metavar="S,S",
            help="which finished runs, comma-separated (default: COMPLETED,FAILED)",
        )
        parser.add_argument("--limit", type=int, default=20, metavar="N", help="at most N runs, oldest first (20)")
        parser.add_argument("--concurrency", type=int, default=4, metavar="K", help="replays in flight at once (4)")
        parser.add_argument(
            "--timeout", type=float, default=600, metavar="SECONDS", help="how long to wait for each replay (600)"
        )

    def handle(self, *args, **opts):
        tenant = self._tenant(opts["tenant"])
        agent = Agent.objects.filter(tenant=tenant, name=opts["agent"]).first()
        if agent is None:
            raise CommandError(f"no agent named {opts['agent']!r} in tenant {tenant.name!r}")
        statuses = [s.strip().upper() for s in opts["status"].split(",") if s.strip()]
        if not statuses or not set(statuses) <= {"COMPLETED", "FAILED", "CANCELLED"}:
            raise CommandError("--status takes finished statuses: COMPLETED, FAILED, CANCELLED")
        if opts["limit"] < 1 or opts["concurrency"] < 1:
            raise CommandError("--limit and --concurrency must be at least 1")
        originals = list(
            Run.objects.select_related("agent", "tenant")
            .filter(
                tenant=tenant,
                agent=agent,
                status__in=statuses,
                created_at__gte=self._since(opts["since"]),
                parent__isnull=True,
                replay_of__isnull=True,
            )
            .order_by("created_at", "id")[: opts["limit"]]
        )
        if not originals:
            self.stdout.write(f"no finished run of {agent.name} since {opts['since']}: nothing to replay")
            return
        rows = self._replay_all(originals, opts)
        self._print(rows, agent.name)
        if any(verdict["verdict"] != "same" for _, _, verdict in rows):
            raise CommandError("not every replay ended the same", returncode=1)

    def _tenant(self, name):
        try:
            return tenant_get(name=name)
        except RunError as exc:
            raise CommandError(exc.message) from None

    def _since(self, text):
        relative = RELATIVE.match(text)
        if relative:
            return CLOCK.now() - timedelta(**{UNITS[relative.group(2)]: int(relative.group(1))})
        moment = parse_datetime(text)
        if moment is None and parse_date(text) is not None:
            moment = parse_datetime(text + "T00:00:00+00:00")
        if moment is None:
            raise CommandError(f"--since {text!r} is neither an ISO date or time nor 30m / 12h / 7d")
        if moment.tzinfo is None:
            raise CommandError("--since needs a time zone (e.g. 2026-12-01T00:00:00Z)")
        return moment

    def _replay_all(self, originals, opts):
        """Replay each run, at most `concurrency` in flight; (original, replay, verdict) in the runs' order."""
        waiting: list[tuple[Run, Run]] = []
        done: dict = {}
        for original in originals:
            while len(waiting) >= opts["concurrency"]:
                self._settle(waiting.pop(0), done, opts["timeout"])
            replay = self._submit(original, opts, waiting, done)
            waiting.append((original, replay))
        while waiting:
            self._settle(waiting.pop(0), done, opts["timeout"])
        return [done[o.id] for o in originals]

    def _submit(self, original, opts, waiting, done):
        while True:
            try:
                return run_replay(run=original, agent_version=opts["version"])
            except QuotaExceeded:
                if not waiting:
                    raise CommandError("the tenant's quota leaves no room for a replay; try again later") from None
                self._settle(waiting.pop(0), done, opts["timeout"])
            except RunError as exc:
                raise CommandError(f"run {original.id}: {exc.message}") from None

    def _settle(self, pair, done, timeout):
        original, replay = pair
        try:
            wait_for_run(replay.id, timeout=timeout, waiting=False)
        except RunWaitTimeout:
            pass  # judged as it is: still running is a failure of the check
        replay = Run.objects.select_related("agent").get(id=replay.id)
        done[original.id] = (original, replay, replay_verdict(original=original, replay=replay))

    def _print(self, rows, agent):
        self.stdout.write(f"{'run':<10} {'replay':<10} {'original':<11} {'replay':<11} verdict")
        for original, replay, verdict in rows:
            said = verdict["verdict"]
            if said == "diverged":
                said = f"diverged at step {verdict['step']}" + (f" ({verdict['why']})" if verdict["why"] else "")
            elif said == "failed":
                said = f"failed ({verdict['why']})"
            ids = f"{short_id(original.id):<10} {short_id(replay.id):<10}"
            self.stdout.write(f"{ids} {original.status:<11} {replay.status:<11} {said}")
        counts = Counter(v["verdict"] for _, _, v in rows)
        steps = Counter(v["step"] for _, _, v in rows if v["verdict"] == "diverged")
        at = ", ".join(f"step {s}: {n}" for s, n in sorted(steps.items(), key=lambda i: (i[0] is None, i[0] or 0)))
        version = rows[0][1].agent_version[:10]
        self.stdout.write(
            f"{len(rows)} runs of {agent} replayed against version {version}: {counts['same']} the same, "
            f"{counts['diverged']} diverged" + (f" ({at})" if at else "") + f", {counts['failed']} failed"
        )
