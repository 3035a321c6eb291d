"""Seeded chaos soak against real processes (RELIABILITY §3–4).

    python -m tests.chaos.soak --runs N --workers W --seed S [--database-url URL] [--duration-cap SECONDS]

What it does
------------
1. Starts a PostgreSQL cluster of its own (tests/chaos/pgcluster.py; or uses
   --database-url), drops and creates its database, migrates it with
   `manage.py migrate`, and sets Django up in this process against it (for
   seeding, observing the database and deciding approvals through
   `approvals.services.approval_decide`).
2. Creates a tenant, an operator holding `approvals.resolve_approval`, and
   one scripted agent per run (seeded: 2–7 tool steps mixing read-only
   `echo` / `http_get` calls with 1–3 side effects to the sink, `delay_ms` on
   every turn so faults can land mid-step). A share of the runs
   (--reconciled-fraction) make their side effects with `reconciled_post`
   (tests/chaos/tools.py: `http_post` with a per-tool reconciler that asks
   the sink whether it holds the key); the others with `http_post`.
3. Starts the effect sink (tests/chaos/infra.py: `tests/sink.py` in its own
   process on a fixed port, logging every POST with its Idempotency-Key and
   X-Agentrt-Attempt), a Redis of its own on a free port (the deployment's
   REDIS_URL; never the machine's shared one), K = ceil(W/2)
   `manage.py qcluster` processes (AGENTRT_WORKERS=2, AGENTRT_LEASE_SECONDS=2,
   fault points enabled), one `run_maintenance` process and the web nodes.
4. Submits the runs (at most `--max-inflight` unfinished at a time) and
   injects faults until every run is terminal or the cap is reached — also
   through the drain: once the last run is submitted (or --deaths is
   reached) the random faults go on until every run has ended:
   - planned faults: each run may carry a plan (`kill@after_watermark`, …).
     The cluster runs with `tool.before_watermark`, `tool.after_watermark`
     and `tool.after_execute` set to `pause`, so every run stops at each of
     these points once (DESIGN §16); the soak then applies that run's plan at
     that exact point (SIGKILL, SIGSTOP for U(L, 3L), or an operator cancel)
     or releases it at once. `kill@after_result` is driven from the database
     instead: the soak watches the run until its first side-effect result is
     committed and kills its worker during the next (delayed) model call.
   - random faults (seeded RNG): every U(--kill-every) seconds SIGKILL a
     process of a type drawn from --kill-mix (tests/chaos/fleet.py): a
     node's pusher, monitor and workers from the moment they start, its
     main process and sentinel (and run_maintenance, a web node) once this
     generation has been up a seeded U(0, --grace) s — no fixed grace period
     after a start, so kills land in a node's first seconds too, without a
     crash loop that would keep it from ever serving; every U(--stop-every) seconds SIGSTOP for
     U(L, 3L) seconds what --stop-mix draws: a worker holding a lease, an
     idle worker, or a whole qcluster node (its process group at once);
     `--cancel-rate` of the runs get an operator cancel at a random moment;
     PostgreSQL restarts once (immediate mode), the soak's Redis once
     (SIGKILL, started again empty), and the effect sink --sink-restarts
     times (armed first so that it holds the next POST unanswered, then
     SIGKILLed with it in flight — the connection resets, an unknown outcome
     — and started again on its port), each at a seeded share of the soak.
   - unknown outcomes without a process death (issue 11): the sink closes
     the connection of --sink-drop-rate of the effect POSTs after reading
     the request, and answers --sink-delay-rate of them only after
     --sink-delay s, past the calls' 2.5 s timeout (seeded per key and
     attempt, by content); such a call ends `uncertain` and parks its run on an
     `uncertain_side_effect` approval (a reconciled run's: its reconciler
     answers).
   - the operator: every interrupted_side_effect (and reconcile) approval is
     approved (probability --approve-rate) or rejected; every
     uncertain_side_effect one is approved, confirmed (took_effect true /
     false) or rejected in the proportions of --uncertain-mix; after
     U(0.1, 1) s; some are first tried with a wrong hash, some are decided
     twice (both must be refused).
5. Stops everything, snapshots the database and runs the pure checker
   (`tests/chaos/checker.py`) over the snapshot, the sink log, the fault
   log, the operator's decisions and the reconcilers' answers; writes
   report.json / report.md (and `--report PATH`; with `--bundle PATH` the
   artifacts are packed into a small compressed bundle and the report is the
   one re-derived from it, tests/chaos/bundle.py); exit status 1 when an
   invariant is violated, 3 when `--require-windows` is given and a window
   got no kill.

How a fault's window is determined ("freeze, classify, act")
------------------------------------------------------------
A worker is never killed blind. The soak first SIGSTOPs it, waits until
/proc shows it stopped (state T) and 80 ms more (so a COMMIT already on the
wire settles), then reads from the database which RUNNING run has a
`lease_owner` naming that pid (`host:pid:nonce`, runs/executor.py
`worker_identity`) and that run's side-effect invocations. While the process
is stopped nothing it does can change them, so the window is exact:
an `executing` invocation (watermark committed, no result) →
`watermark_to_result`; else an `authorized` one (watermark not written yet)
→ `before_watermark`; else a side-effect result already recorded →
`after_result`; else `no_effect`. Only then is the worker SIGKILLed (kill),
left stopped for U(L, 3L) s and SIGCONTed (stop), or — when it turns out to
hold no lease and the draw wanted a busy one — SIGCONTed and logged as
`aborted`. A whole node is frozen at once (SIGSTOP of its process group) and
each of its workers classified while all are stopped.

Seeding: agents, plans, approval decisions, cancel choices, fault intervals,
victim picks, stop lengths, the reconciled runs and the restarts' moments
come from `random.Random` seeded with --seed (per run / per approval where
possible), so the *plan* is reproducible; what each fault hits still depends
on timing, which is why every fault is classified from the database, not
assumed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
import traceback
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tests import secret_env  # noqa: F401  (a throw-away DJANGO_SECRET_KEY for this and its processes)
from tests.chaos.fleet import DEFAULT_MIX, STOP_MIX, STOP_ROLES, WebSubmitter, node_roles, parse_mix
from tests.chaos.infra import EffectSink, PrivateRedis
from tests.chaos.pgcluster import PrivatePostgres
from tests.chaos.plans import (
    CONFLICT_ENV,
    LOG_ENV,
    PLAN_NAMES,
    PLANS,
    POINTS,
    POST_TIMEOUT,
    RECONCILED_TOOL,
    SEED_ENV,
    SINK_ENV,
    TOOL_MODULE,
    RunSpec,
    agent_definition,
)
from tests.chaos.procs import ROOT, Proc, descendants, proc_state, proc_table, recreate_database
from tests.chaos.report import render_markdown
from tests.chaos.snapshot import take_snapshot
from tests.conftest import free_port
from tests.procfs import comm, stat

LEASE = 2.0
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")
WINDOW_RANK = ("watermark_to_result", "before_watermark", "after_result", "no_effect")
# approve refused because the run cannot go on after the decision (approvals/errors.py): confirm or reject instead
CLOSING_REFUSALS = ("run_cancel_requested", "run_deadline_passed", "run_budget_exhausted")
CONFIRMABLE = ("interrupted_side_effect", "uncertain_side_effect")  # confirm (took_effect) is offered for these
ROLE_OF_TYPE = {"qcluster_main": "main", "run_maintenance": "maintenance", "web_node": "web", "pg_backend": "backend"}


def log(msg: str) -> None:
    print(f"[soak {datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).isoformat(timespec="milliseconds")


def parse_range(text: str) -> tuple[float, float] | None:
    if text in ("", "off", "0"):
        return None
    a, _, b = text.partition(",")
    return float(a), float(b or a)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m tests.chaos.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, required=True)
    p.add_argument("--workers", type=int, default=4, help="worker processes in total (2 per qcluster)")
    p.add_argument("--clusters", type=int, default=None, help="qcluster processes (default ceil(workers/2))")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--database-url", default=None, help="default: agentrt_chaos on $DATABASE_URL's server")
    p.add_argument("--duration-cap", type=float, default=1800.0, help="seconds after the first submit")
    p.add_argument("--max-inflight", type=int, default=None, help="unfinished runs at a time (default 2 x workers)")
    p.add_argument(
        "--planned-fraction",
        type=float,
        default=0.5,
        help="share of runs with a planned fault; >= 1 cycles through every plan (CI)",
    )
    p.add_argument("--plans", default="all", help="comma-separated plan names to draw from (default: all of them)")
    p.add_argument("--kill-every", default="3,10", help="random SIGKILL every U(a,b) s ('off' to disable)")
    p.add_argument(
        "--stop-every", default="20,60", help="random SIGSTOP (see --stop-mix) every U(a,b) s ('off' to disable)"
    )
    p.add_argument(
        "--cancel-rate", type=float, default=0.1, help="share of the runs without a plan cancelled at a random moment"
    )
    p.add_argument("--approve-rate", type=float, default=0.7)
    p.add_argument(
        "--sink-drop-rate",
        type=float,
        default=0.03,
        help="share of the effect POSTs whose connection the sink closes after reading the request (no answer)",
    )
    p.add_argument(
        "--sink-delay-rate",
        type=float,
        default=0.03,
        help="share of the effect POSTs the sink answers only after --sink-delay s (past the call's timeout)",
    )
    p.add_argument(
        "--sink-delay", type=float, default=4.0, help="seconds; the agents' http_post calls time out after 2.5 s"
    )
    p.add_argument(
        "--uncertain-mix",
        default="0.4,0.2,0.2,0.2",
        help="uncertain_side_effect decisions: approve, confirm took_effect=true, confirm took_effect=false, reject",
    )
    p.add_argument("--no-faults", action="store_true", help="baseline: no fault points, no kills, stops or cancels")
    p.add_argument("--out", default=None, help="artifact folder (default artifacts/chaos/seed-S-<time>)")
    p.add_argument("--report", default=None, help="also write the markdown report here")
    p.add_argument(
        "--bundle",
        default=None,
        help="also pack the artifacts into this compressed bundle (tests/chaos/bundle.py); --report is then the "
        "report re-derived from it",
    )
    p.add_argument("--require-windows", action="store_true", help="exit 3 unless kills landed in every window")
    p.add_argument("--baseline", default=None, help="a --no-faults run's report.json: compare throughput with it")
    p.add_argument(
        "--web-nodes", type=int, default=2, help="daphne web nodes serving submits (0: every run submitted in-process)"
    )
    p.add_argument(
        "--web-fraction", type=float, default=0.5, help="share of the runs submitted over HTTP to the web nodes"
    )
    p.add_argument(
        "--kill-mix",
        default=DEFAULT_MIX,
        help="weights of the process types a random kill picks (busy_worker, idle_worker, pusher, monitor, sentinel, "
        "main, maintenance, web, backend = pg_terminate_backend)",
    )
    p.add_argument(
        "--pg-restart-at",
        type=float,
        default=None,
        help="restart PostgreSQL (once) when this share of the runs is submitted, or of --deaths is reached "
        "(default: seeded U(0.3, 0.6)); needs the private cluster",
    )
    p.add_argument("--no-pg-restart", action="store_true")
    p.add_argument(
        "--deaths",
        type=int,
        default=None,
        help="stop submitting once this many process deaths were injected, then drain: every run must end while "
        "the random faults go on (--runs is then a cap)",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=40.0,
        help="each generation of a qcluster node (its main process and sentinel), of run_maintenance and of a web "
        "node may be killed once it has been up a seeded U(0, GRACE) s: a node lives 20 s on average, as with the "
        "fixed 20 s grace this replaces, but half of those kills land in its first 20 s, some in its first second "
        "(none at all kills nodes faster than they start: a crash loop, not a fault). Its other processes die from "
        "their start",
    )
    p.add_argument(
        "--cover-types",
        action="store_true",
        help="random kills (stops) first draw among the process types (kinds of stop) not yet hit, until each was "
        "hit once (a short soak)",
    )
    p.add_argument(
        "--stop-mix",
        default=STOP_MIX,
        help="weights of what a random SIGSTOP freezes: busy_worker, idle_worker, node (a whole qcluster node)",
    )
    p.add_argument(
        "--reconciled-fraction",
        type=float,
        default=0.2,
        help=f"share of the runs whose side effects use {RECONCILED_TOOL} (the same request, with a reconciler "
        "that asks the sink: tests/chaos/tools.py); with --planned-fraction >= 1, every second cycle of the plans",
    )
    p.add_argument(
        "--conflict-share",
        type=float,
        default=0.1,
        help="share of the keys (seeded) for which the reconciler answers conflict",
    )
    p.add_argument(
        "--sink-restarts",
        type=int,
        default=1,
        help="times the effect sink is SIGKILLed with a request in flight and started again (seeded moments)",
    )
    p.add_argument("--no-redis", action="store_true", help="no Redis (the deployment runs without REDIS_URL)")
    p.add_argument(
        "--redis-restart-at",
        type=float,
        default=None,
        help="restart the soak's Redis (once) at this share of the runs or deaths (default: seeded U(0.6, 0.8))",
    )
    p.add_argument("--no-redis-restart", action="store_true")
    return p.parse_args(argv)


def default_db_url(arg: str | None) -> str:
    if arg:
        return arg
    env = os.environ.get("DATABASE_URL", "")
    if env.startswith(("postgres://", "postgresql://")):
        return urlunsplit(urlsplit(env)._replace(path="/agentrt_chaos"))
    return "postgres://postgres@127.0.0.1:5432/agentrt_chaos"


def read_jsonl(path: Path) -> list[dict]:
    """One dict per line; a line cut short (a process killed while writing it) is skipped."""
    from tests.chaos.checker import parse_jsonl

    return parse_jsonl(path.read_text()) if path.exists() else []


def parse_tracebacks(lines: list[str]) -> list[dict]:
    """Each traceback of a process log: when (the log record before it, as
    POSIX seconds: `t`, a lower bound — a child process's traceback printed
    by multiprocessing has no record of its own — and `t_next`, the next
    record's, an upper bound), which logger line, and every exception of its
    chain ("module.Type: message", first line of the message)."""
    import re

    stamp = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")
    exc_line = re.compile(
        r"^([A-Za-z_][\w.]*(?:Error|Exception|Shutdown|Exit|Interrupt|Warning)): "
        r"?(.*)$|^([A-Za-z_][\w.]*(?:Error|Exception))$"
    )
    out: list[dict] = []
    cur: dict | None = None
    last_record: dict | None = None
    for line in lines:
        m = stamp.match(line)
        if m:
            t = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
            last_record = {"t": t, "record": line[:200]}
            for tb in reversed(out):
                if "t_next" in tb:
                    break
                tb["t_next"] = t
            cur = None
            continue
        if line.startswith("Traceback"):
            if cur is None:
                cur = {
                    "t": last_record["t"] if last_record else None,
                    "record": last_record["record"] if last_record else None,
                    "exceptions": [],
                }
                out.append(cur)
            continue
        if cur is not None and not line.startswith((" ", "\t")):
            e = exc_line.match(line)
            if e:
                cur["exceptions"].append(f"{e.group(1) or e.group(3)}: {(e.group(2) or '')[:160]}")
    return out


def parse_worker_pids(lines: list[str]) -> list[int]:
    """The pid of every worker a node's log says it started: django-q2's "ready for work at PID"
    (INFO), and the workers our sentinel respawns when it replaces the queues (CRITICAL)."""
    import re

    ready = re.compile(r"ready for work at (\d+)\s*$")  # django-q2, at INFO
    rebuilt = re.compile(r"reincarnated pusher \d+, monitor \d+ and workers \[([\d, ]*)\]")  # qheal, CRITICAL
    pids = []
    for line in lines:
        if m := ready.search(line):
            pids.append(int(m.group(1)))
        elif m := rebuilt.search(line):
            pids += [int(p) for p in m.group(1).split(",") if p.strip()]
    return pids


def worst_window(held: list[dict]) -> str:
    """The most sensitive window among the runs a process held ('idle' for none)."""
    windows = {h["window"] for h in held}
    return next((w for w in WINDOW_RANK if w in windows), "idle")


def db_errors():
    from django.db import InterfaceError, OperationalError

    return (OperationalError, InterfaceError)


# -- the soak ------------------------------------------------------------------------


class Soak:
    def __init__(self, args):
        self.args = args
        self.seed = args.seed
        self.rng = random.Random(f"{args.seed}:chaos")
        # a private PostgreSQL cluster unless a database is named: the soak restarts it and terminates its backends
        self.pg: PrivatePostgres | None = None
        self.db_url = args.database_url
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        self.out = Path(args.out) if args.out else ROOT / "artifacts" / "chaos" / f"seed-{args.seed}-{stamp}"
        self.workers = max(1, args.workers)
        self.n_clusters = args.clusters or math.ceil(self.workers / 2)
        self.max_inflight = args.max_inflight or 2 * self.workers
        self.kill_every = None if args.no_faults else parse_range(args.kill_every)
        self.stop_every = None if args.no_faults else parse_range(args.stop_every)
        self.fault_dir = self.out / "faultpoints"
        self.clusters: list[Proc] = []
        self.maintenance: Proc | None = None
        self.sink: EffectSink | None = None
        self.sink_host = ""
        self.redis: PrivateRedis | None = None
        self.specs: list[RunSpec] = []
        self.by_run: dict[str, RunSpec] = {}
        self.pid_cluster: dict[int, int] = {}
        self.stopped: dict[int, dict] = {}  # pid -> {"cont_at", "fault"}
        self.handled_markers: set[str] = set()
        self.pending_cancels: list[dict] = []
        self.pending_decisions: dict[str, dict] = {}
        self.faults: list[dict] = []
        self.decisions: list[dict] = []
        self.statuses: dict[str, str] = {}
        # what the loop looks at every tick, kept small (a long soak has thousands of runs)
        self.open_runs: set[str] = set()  # submitted, not terminal
        self.n_submitted = 0
        self.n_deaths = 0
        self.next_spec = 0  # specs before it are submitted, pending over HTTP, or refused
        self.cancel_specs: list[RunSpec] = []
        self.t_first_submit: float | None = None
        self.polls = 0
        self.waiting_with_lease: list[dict] = []
        self.web: list[Proc] = []
        self.web_ports: list[int] = []
        self.submitter: WebSubmitter | None = None
        self.web_pending: dict[int, object] = {}  # spec index -> Future
        self.kill_mix = parse_mix(args.kill_mix)
        self.owed = {r for r, w in self.kill_mix.items() if w > 0} if args.cover_types else set()
        self.roles: dict[int, dict[str, list[int]]] = {}  # node -> {kernel name: pids}
        self.pid_node: dict[int, int] = {}  # every worker pid ever seen -> its node (recovery figures)
        self.exits: list[dict] = []  # the supervisor's log: each exit of a supervised process and its restart
        self.db_outages = 0
        self.pg_restart_done = False
        self.pg_restart_at = (
            args.pg_restart_at
            if args.pg_restart_at is not None
            else random.Random(f"{args.seed}:pg-restart").uniform(0.3, 0.6)
        )
        self.stopped_submitting = False
        self.stopped_early_at: int | None = None
        self._workers_at = 0.0
        self.stop_mix = parse_mix(args.stop_mix, STOP_ROLES)
        # --cover-types: every kind of stop lands once too (a worker holding a lease, an idle worker, a node)
        self.stops_owed = {r for r, w in self.stop_mix.items() if w > 0} if args.cover_types else set()
        self.stopped_nodes: dict[int, dict] = {}  # node -> {"cont_at", "fault", "pids"}
        self.t_drain: float | None = None  # when the last submit was made: the drain begins (faults go on)
        self.drain_deaths_from = 0
        # the outside world restarted under load: the sink (with a request held in flight) and Redis, at seeded
        # shares of the soak; each is owed until it happened
        srng = random.Random(f"{args.seed}:sink-restart")
        self.sink_restart_at = sorted(
            srng.uniform(0.15, 0.95) for _ in range(0 if args.no_faults else args.sink_restarts)
        )
        self.sink_armed: dict | None = None  # {"t", "deadline"} while waiting for the held POST
        self.redis_restart_at = (
            args.redis_restart_at
            if args.redis_restart_at is not None
            else random.Random(f"{args.seed}:redis-restart").uniform(0.6, 0.8)
        )
        self.redis_restart_owed = not (args.no_faults or args.no_redis or args.no_redis_restart)

    # -- setup ---------------------------------------------------------------------
    def env(self, **extra) -> dict:
        env = dict(os.environ)
        env.update(
            {
                "DATABASE_URL": self.db_url,
                "AGENTRT_LEASE_SECONDS": str(LEASE),
                "AGENTRT_HTTP_TOOL_ALLOWED_HOSTS": self.sink_host,
                "AGENTRT_ENABLE_FAULTPOINTS": "0" if self.args.no_faults else "1",
                "AGENTRT_FAULTPOINTS": "" if self.args.no_faults else ",".join(f"{p}=pause" for p in POINTS),
                "AGENTRT_FAULTPOINT_DIR": str(self.fault_dir),
                "AGENTRT_LOG_LEVEL": "WARNING",
                "PYTHONUNBUFFERED": "1",
                "AGENTRT_THROTTLE_RUNS_CREATE": "100000/min",
                # one tenant runs every soak run, so its share of the leases never holds one back: at most
                # --max-inflight runs are unfinished at a time, each counted while a dead worker's lease lasts (the
                # share's claim path still runs); not the default, half of one node's workers
                "AGENTRT_TENANT_MAX_RUNNING": str(self.max_inflight),
                # the reconciled runs' tool and its reconciler (tests/chaos/tools.py), which asks the sink
                "AGENTRT_TOOL_MODULES": TOOL_MODULE,
                SINK_ENV: str(self.out / "sink.jsonl"),
                LOG_ENV: str(self.out / "reconcile.jsonl"),
                SEED_ENV: str(self.seed),
                CONFLICT_ENV: str(self.args.conflict_share),
            }
        )
        env.pop("AGENTRT_RECONCILER", None)  # no global reconciler: the operator decides unless the tool reconciles
        env.pop("REDIS_URL", None)
        if self.redis is not None:
            env["REDIS_URL"] = self.redis.url
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def setup_database(self) -> None:
        if self.db_url is None:
            self.pg = PrivatePostgres().start()
            self.db_url = self.pg.url("agentrt_chaos")
            log(f"private PostgreSQL cluster on port {self.pg.port} ({self.pg.dir})")
        log(f"database {self.db_url}: drop, create, migrate")
        recreate_database(self.db_url)
        env = dict(os.environ, DATABASE_URL=self.db_url)
        with open(self.out / "migrate.log", "wb") as fh:
            subprocess.run(
                [sys.executable, "manage.py", "migrate", "--noinput"],
                cwd=ROOT,
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
                check=True,
            )
        os.environ["DATABASE_URL"] = self.db_url
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrt_site.settings")
        for key in ("AGENTRT_LEASE_SECONDS", "AGENTRT_ENABLE_FAULTPOINTS", "AGENTRT_FAULTPOINTS", "AGENTRT_RECONCILER"):
            os.environ.pop(key, None)  # this process only seeds, observes and decides
        os.environ.pop("REDIS_URL", None)  # the observer never depends on the Redis it restarts
        os.environ["AGENTRT_TOOL_MODULES"] = TOOL_MODULE  # its agents name the reconciled tool
        os.environ["PGAPPNAME"] = "soak-observer"  # never a victim of the backend terminations
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        import django

        django.setup()

    def start_sink(self) -> None:
        self.sink = EffectSink(
            self.out,
            seed=self.seed,
            drop=0.0 if self.args.no_faults else self.args.sink_drop_rate,
            delay=0.0 if self.args.no_faults else self.args.sink_delay_rate,
            delay_s=self.args.sink_delay,
        ).start()
        self.sink_host = self.sink.host
        log(f"sink on {self.sink_host}")

    def start_redis(self) -> None:
        if self.args.no_redis:
            return
        self.redis = PrivateRedis(self.out).start()
        log(f"private Redis on port {self.redis.port}")

    def seed_tenant(self) -> None:
        from django.contrib.auth.models import Permission

        from runs.services import agent_load, tenant_create

        self.tenant, _ = tenant_create(name="chaos", username="chaos-dev")
        _, op = tenant_create(name="chaos", username="chaos-operator")
        op.user_permissions.add(Permission.objects.get(codename="resolve_approval"))
        self.operator = type(op).objects.get(pk=op.pk)
        if self.args.web_nodes > 0:
            from knox.models import AuthToken

            dev = type(op).objects.get(username="chaos-dev")
            _, self.token = AuthToken.objects.create(user=dev)
        plans = self.assign_plans()
        for i in range(self.args.runs):
            rng = random.Random(f"{self.seed}:agent:{i}")
            reconciled = self.reconciled(i)
            definition, posts = agent_definition(
                i, rng, self.sink_host, plans[i], RECONCILED_TOOL if reconciled else "http_post"
            )
            if i < 2 * self.max_inflight:
                agent_load(tenant=self.tenant, definition=definition)  # the rest at submit time
            crng = random.Random(f"{self.seed}:cancel:{i}")
            # random cancels only for runs without a planned fault, so that every plan lands
            cancel_after = (
                crng.uniform(0.2, 4.0)
                if (not self.args.no_faults and plans[i] == "none" and crng.random() < self.args.cancel_rate)
                else None
            )
            spec = RunSpec(i, plans[i], definition["name"], posts, cancel_after, reconciled)
            spec.definition = definition
            spec.via = (
                "web"
                if (self.args.web_nodes > 0 and random.Random(f"{self.seed}:via:{i}").random() < self.args.web_fraction)
                else "service"
            )
            self.specs.append(spec)
        log(
            f"{len(self.specs)} agents ({sum(s.reconciled for s in self.specs)} reconciled); plans "
            f"{dict(Counter(s.plan for s in self.specs))}"
        )

    def reconciled(self, i: int) -> bool:
        """Whether run i's side effects use the reconciled tool: seeded per run, or, when the plans are cycled
        (--planned-fraction >= 1), every second cycle, so that each plan lands with and without a reconciler."""
        f = self.args.reconciled_fraction
        if f <= 0:
            return False
        if self.args.planned_fraction >= 1 and not self.args.no_faults:
            return (i // len(self.plan_names())) % 2 == 1
        return random.Random(f"{self.seed}:reconciled:{i}").random() < f

    def assign_plans(self) -> list[str]:
        n = self.args.runs
        if self.args.no_faults:
            return ["none"] * n
        rng = random.Random(f"{self.seed}:plans")
        names = self.plan_names()
        unknown = [p for p in names if p not in PLANS]
        if unknown or not names:
            raise SystemExit(f"unknown plan(s) {unknown}; known: {', '.join(PLAN_NAMES)}")
        if self.args.planned_fraction >= 1:
            order = names[:]
            rng.shuffle(order)
            return [order[i % len(order)] for i in range(n)]
        return [rng.choice(names) if rng.random() < self.args.planned_fraction else "none" for _ in range(n)]

    def plan_names(self) -> list[str]:
        return PLAN_NAMES if self.args.plans == "all" else [p.strip() for p in self.args.plans.split(",") if p.strip()]

    def start_processes(self) -> None:
        self.fault_dir.mkdir(parents=True, exist_ok=True)
        left = self.workers
        for k in range(self.n_clusters):
            w = 2 if k < self.n_clusters - 1 else max(1, left)
            left -= w
            self.clusters.append(
                Proc(
                    f"qcluster-{k}",
                    [sys.executable, "manage.py", "qcluster"],
                    self.env(AGENTRT_WORKERS=w, PGAPPNAME=f"soak-node-{k}"),
                    self.out / f"qcluster-{k}.log",
                    role="qcluster",
                )
            )
        self.maintenance = Proc(
            "maintenance",
            [sys.executable, "manage.py", "run_maintenance"],
            self.env(PGAPPNAME="soak-maintenance"),
            self.out / "maintenance.log",
            role="maintenance",
        )
        for k in range(max(0, self.args.web_nodes)):
            port = free_port()
            self.web_ports.append(port)
            self.web.append(
                Proc(
                    f"web-{k}",
                    [
                        sys.executable,
                        "-m",
                        "daphne",
                        "-b",
                        "127.0.0.1",
                        "-p",
                        str(port),
                        "-v",
                        "0",
                        "agentrt_site.asgi:application",
                    ],
                    self.env(PGAPPNAME=f"soak-web-{k}"),
                    self.out / f"web-{k}.log",
                    role="web",
                )
            )
        deadline = time.time() + 90
        while time.time() < deadline:
            self.refresh_workers()
            if sum(len(r.get("qc-worker", [])) for r in self.roles.values()) >= self.workers and all(
                self.web_ready(k) for k in range(len(self.web))
            ):
                break
            time.sleep(0.2)
        if self.web:
            self.submitter = WebSubmitter(self.web_ports, self.token, self.seed)
        log(
            f"{self.n_clusters} qcluster(s), {self.workers} workers, maintenance {self.maintenance.pid}, web nodes on "
            f"{self.web_ports}"
        )

    def web_ready(self, k: int) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.web_ports[k]}/healthz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def supervised(self) -> list[Proc]:
        return self.clusters + ([self.maintenance] if self.maintenance else []) + self.web

    def supervise(self) -> None:
        """The supervisor (systemd's Restart=on-failure): a process of the
        deployment that exited is started again, and the exit is logged."""
        now = time.time()
        for p in self.supervised():
            rc = p.exited()
            if rc is None:
                continue
            cause = next(
                (
                    f["id"]
                    for f in reversed(self.faults)
                    if f.get("kind") == "kill" and f.get("supervised") == p.name and now - f["t"] < 120
                ),
                None,
            )
            entry = {"name": p.name, "role": p.role, "pid": p.pid, "rc": rc, "t": now, "fault": cause}
            p.restart()
            entry["restarted_pid"] = p.pid
            p.exits.append(entry)
            self.exits.append(entry)
            if rc == 0:
                log(f"{p.name} exited 0 (not a failure) — restarted anyway: the soak needs it")

    # -- processes ----------------------------------------------------------------
    def refresh_workers(self) -> None:
        table = proc_table()
        pids = {}
        for k, c in enumerate(self.clusters):
            for pid in descendants(c.pid, table):
                pids[pid] = k
            self.roles[k] = node_roles(c.pid)
            for pid in self.roles[k].get("qc-worker", []):
                self.pid_node[pid] = k
        self.pid_cluster = pids
        self._workers_at = time.time()

    def ours(self, pid: int, name: str) -> bool:
        """`pid` is still a process of this soak's deployment with kernel name
        `name`: pids are reused (pid_max may be 32768), and the machine runs
        other people's qclusters — same names, never our sessions."""
        fields = stat(pid)
        sessions = {g.pid for p in self.clusters for g in p.generations}
        return fields is not None and fields[0] not in ("Z", "X") and int(fields[3]) in sessions and comm(pid) == name

    def freeze(self, pid: int) -> float | None:
        """SIGSTOP and wait until the process is stopped; None if it is gone."""
        if not self.ours(pid, "qc-worker"):
            return None
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return None
        t = time.time()
        deadline = t + 2
        while time.time() < deadline:
            st = proc_state(pid)
            if st is None or st in ("Z", "X"):
                return None
            if st in ("T", "t"):
                break
            time.sleep(0.005)
        time.sleep(0.08)  # a COMMIT already sent settles on the server
        if not self.ours(pid, "qc-worker"):  # stopped now, so it cannot change: not ours after all
            self.cont(pid)
            return None
        return t

    def cont(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def classify(self, pid: int) -> list[dict]:
        """The runs whose lease names `pid` and the window each one is in."""
        from django.db import connection

        held = []
        with connection.cursor() as cur:
            cur.execute(
                "SELECT id, lease_epoch, lease_expires_at < now() FROM runs WHERE status = 'RUNNING'"
                " AND lease_owner LIKE %s",
                [f"%:{pid}:%"],
            )
            rows = cur.fetchall()
            for run_id, epoch, expired in rows:
                cur.execute(
                    "SELECT id, status, attempt, result IS NOT NULL FROM tool_invocations WHERE run_id = %s AND"
                    " NOT read_only ORDER BY step_number, call_index",
                    [run_id],
                )
                invs = cur.fetchall()
                window, inv, attempt = "no_effect", None, None
                executing = [r for r in invs if r[1] == "executing"]
                authorized = [r for r in invs if r[1] == "authorized"]
                done = [r for r in invs if r[3]]
                if executing:
                    window, inv, attempt = "watermark_to_result", executing[0][0], executing[0][2]
                elif authorized:
                    window, inv, attempt = "before_watermark", authorized[0][0], authorized[0][2]
                elif done:
                    window, inv, attempt = "after_result", done[-1][0], done[-1][2]
                spec = self.by_run.get(str(run_id))
                held.append(
                    {
                        "run": str(run_id),
                        "run_index": spec.index if spec else None,
                        "epoch": epoch,
                        "lease_expired": bool(expired),
                        "window": window,
                        "invocation": str(inv) if inv else None,
                        "attempt": attempt,
                    }
                )
        return held

    def record(self, fault: dict) -> dict:
        fault["id"] = len(self.faults) + 1
        self.faults.append(fault)
        if fault.get("kind") in ("kill", "terminate", "pg_restart", "redis_restart"):
            self.n_deaths += 1
        return fault

    def inject(
        self,
        pid: int,
        kind: str,
        source: str,
        plan: str | None = None,
        point: str | None = None,
        require_lease: bool = True,
    ) -> dict | None:
        """Freeze, classify, act (see the module docstring)."""
        if kind == "stop" and self.node_stopped(pid):
            return None  # its whole node is frozen already
        if pid in self.stopped:
            if kind == "stop":
                return None
            entry = self.stopped.pop(pid)  # killed while stopped: it never ran again
            entry["fault"]["t_cont"] = time.time()
            entry["fault"]["killed_while_stopped"] = True
            t_freeze = entry["fault"]["t_freeze"]
        else:
            t_freeze = self.freeze(pid)
            if t_freeze is None:
                return None
        try:
            held = self.classify(pid)
        except db_errors():
            self.db_lost()
            self.cont(pid)  # the window cannot be read: nothing is done to it
            self.record(
                {
                    "kind": "aborted",
                    "wanted": kind,
                    "pid": pid,
                    "source": source,
                    "plan": plan,
                    "t": time.time(),
                    "why": "database unreachable while frozen",
                }
            )
            return None
        base = {
            "source": source,
            "plan": plan,
            "point": point,
            "pid": pid,
            "cluster": self.pid_cluster.get(pid),
            "t_freeze": t_freeze,
            "at": iso(t_freeze),
            "held": held,
            "role": "busy_worker" if held else "idle_worker",
            "window": worst_window(held),
            "uptime": self.uptime(self.pid_node.get(pid)),
        }
        if require_lease and not held:
            self.cont(pid)
            self.record({**base, "kind": "aborted", "wanted": kind})
            return None
        if kind == "kill":
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return self.record({**base, "kind": "kill", "t": time.time(), "node": self.pid_node.get(pid)})
        duration = self.rng.uniform(LEASE, 3 * LEASE)
        fault = self.record(
            {**base, "kind": "stop", "t": t_freeze, "duration": round(duration, 3), "t_cont": t_freeze + duration}
        )
        self.stopped[pid] = {"cont_at": t_freeze + duration, "fault": fault}
        return fault

    # -- the loop's jobs ----------------------------------------------------------
    def submit_more(self, inflight: int) -> None:
        """Submit runs up to --max-inflight: in-process (`run_submit`) or over
        HTTP to a web node (seeded per run). Both carry an Idempotency-Key, so
        a submit whose answer was lost (a killed web node, a terminated
        backend, the database restarting) is sent again without doubling."""
        from runs.services import agent_load, run_submit

        self.collect_web_submits()
        inflight += len(self.web_pending)
        while self.next_spec < len(self.specs):
            spec = self.specs[self.next_spec]
            if inflight >= self.max_inflight or self.stopped_submitting:
                return
            if spec.run_id is not None or spec.index in self.web_pending or getattr(spec, "submit_error", None):
                self.next_spec += 1
                continue
            key = f"chaos-{self.seed}-{spec.index}"
            if not getattr(spec, "agent_loaded", False):
                agent_load(tenant=self.tenant, definition=spec.definition)  # idempotent: its version is its hash
                spec.agent_loaded = True
            spec.submitted_at = spec.submitted_at or time.time()
            self.t_first_submit = self.t_first_submit or spec.submitted_at
            if spec.via == "web":
                self.web_pending[spec.index] = self.submitter.submit(
                    spec.index, spec.agent, f"chaos run {spec.index}", key
                )
                inflight += 1
                continue
            spec.service_attempts = getattr(spec, "service_attempts", 0) + 1
            run, _ = run_submit(
                tenant=self.tenant, agent=spec.agent, input=f"chaos run {spec.index}", idempotency_key=key
            )
            self.accept(spec, str(run.id))
            inflight += 1

    def accept(self, spec: RunSpec, run_id: str) -> None:
        spec.run_id = run_id
        self.by_run[spec.run_id] = spec
        self.statuses.setdefault(spec.run_id, "QUEUED")
        self.open_runs.add(run_id)
        self.n_submitted += 1
        if spec.cancel_after is not None:
            self.cancel_specs.append(spec)

    def collect_web_submits(self) -> None:
        for index, fut in list(self.web_pending.items()):
            if not fut.done():
                continue
            del self.web_pending[index]
            res = fut.result()
            spec = self.specs[index]
            spec.web = res
            if res.get("run"):
                self.accept(spec, res["run"])
            else:
                spec.submit_error = res.get("error")
                log(f"web submit of run {index} refused: {res.get('error')}")

    def poll_statuses(self) -> None:
        from django.db import connection

        if not self.open_runs:
            return
        with connection.cursor() as cur:
            cur.execute(
                "SELECT id, status, lease_owner, lease_expires_at FROM runs WHERE id = ANY(%s::uuid[])",
                [list(self.open_runs)],
            )
            rows = cur.fetchall()
        for i, st, _, _ in rows:  # a terminal status is final: those runs are not read again
            self.statuses[str(i)] = st
            if st in TERMINAL:
                self.open_runs.discard(str(i))
        self.polls += 1
        for i, s, owner, expires in rows:  # I5 observed live, not only at the end
            if s.startswith("WAITING") and (owner is not None or expires is not None):
                self.waiting_with_lease.append({"run": str(i), "status": s, "lease_owner": owner, "t": time.time()})

    def handle_markers(self, full: bool = True) -> None:
        """Act on every `<point>.<run>.paused` file (DESIGN §16's `pause`).
        Marker files are never deleted: they are what makes a point fire
        once per run, also for a zombie that resumes after its run ended."""
        if full:
            try:
                names = os.listdir(self.fault_dir)
            except FileNotFoundError:
                return
        else:
            names = [f"{p}.{run_id}.paused" for run_id in self.open_runs for p in POINTS]
            names = [n for n in names if n not in self.handled_markers and (self.fault_dir / n).exists()]
        for name in names:
            if not name.endswith(".paused") or name in self.handled_markers:
                continue
            self.handled_markers.add(name)
            base = name[: -len(".paused")]
            point, _, run_id = base.rpartition(".")
            go = self.fault_dir / f"{base}.go"
            try:
                pid = int((self.fault_dir / base).read_text() or 0)
            except (OSError, ValueError):
                pid = 0
            spec = self.by_run.get(run_id)
            plan = spec.plan if spec else "none"
            want_point, action = PLANS.get(plan, (None, None))
            if spec is None or spec.planned_done or want_point != point or not pid:
                go.touch()
                continue
            spec.planned_done = True
            try:
                if action == "cancel":
                    self.planned_cancel(spec, go, pid, point)
                    continue
                fault = self.inject(pid, action, "planned", plan=plan, point=point, require_lease=False)
            except db_errors():
                self.db_lost()
                fault = None
            go.touch()  # a stopped worker goes on at SIGCONT; a killed one never reads it
            if fault is None:
                self.record(
                    {"kind": "missed", "plan": plan, "point": point, "pid": pid, "run": run_id, "t": time.time()}
                )

    def planned_cancel(self, spec: RunSpec, go: Path, pid: int, point: str) -> None:
        from runs.models import Run
        from runs.services.lifecycle import run_cancel

        run = Run.objects.get(id=spec.run_id)
        seen = run.lease_expires_at
        try:
            after = run_cancel(run=run, by="chaos")
        except Exception as exc:  # the run ended meanwhile
            after = type(exc).__name__
        self.record(
            {
                "kind": "cancel",
                "source": "planned",
                "plan": spec.plan,
                "point": point,
                "pid": pid,
                "run": spec.run_id,
                "t": time.time(),
                "at": iso(time.time()),
                "status_after": after,
            }
        )
        # release once a heartbeat has read the cancel (the token is set), as tests/fault does
        self.pending_cancels.append({"run": spec.run_id, "go": go, "seen": seen, "deadline": time.time() + 3 * LEASE})

    def release_cancels(self) -> None:
        from runs.models import Run

        keep = []
        for item in self.pending_cancels:
            now_exp = Run.objects.filter(id=item["run"]).values_list("lease_expires_at", flat=True).first()
            if now_exp != item["seen"] or time.time() > item["deadline"]:
                item["go"].touch()
            else:
                keep.append(item)
        self.pending_cancels = keep

    def watch_after_result(self) -> None:
        """`kill@after_result`: kill the worker once the run's first side-effect
        result is committed and nothing else is in flight."""
        from django.db import connection

        waiting = [
            r
            for r in self.open_runs
            if self.by_run[r].plan == "kill@after_result"
            and not self.by_run[r].planned_done
            and self.statuses.get(r) in ("RUNNING", "QUEUED")
        ]
        if not waiting:
            return
        with connection.cursor() as cur:
            cur.execute(
                "SELECT r.id, r.lease_owner FROM runs r WHERE r.id = ANY(%s::uuid[]) AND r.status = 'RUNNING'"
                " AND r.lease_owner IS NOT NULL"
                " AND r.lease_expires_at > now()"
                " AND EXISTS (SELECT 1 FROM tool_invocations t WHERE t.run_id = r.id AND NOT t.read_only"
                " AND t.result IS NOT NULL)"
                " AND NOT EXISTS (SELECT 1 FROM tool_invocations t WHERE t.run_id = r.id AND NOT t.read_only"
                " AND t.status IN ('authorized', 'executing'))",
                [waiting],
            )
            rows = cur.fetchall()
        for run_id, owner in rows:
            try:
                pid = int(owner.split(":")[1])
            except (IndexError, ValueError):
                continue
            if pid not in self.pid_cluster:
                continue
            spec = self.by_run[str(run_id)]
            spec.planned_done = True
            if self.inject(pid, "kill", "planned", plan=spec.plan) is None:
                spec.planned_done = False  # it moved on; try again

    def busy_workers(self) -> list[int]:
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute(
                "SELECT lease_owner FROM runs WHERE status = 'RUNNING' AND lease_owner IS NOT NULL"
                " AND lease_expires_at > now()"
            )
            owners = [r[0] for r in cur.fetchall()]
        pids = set()
        for owner in owners:
            try:
                pid = int(owner.split(":")[1])
            except (IndexError, ValueError):
                continue
            if pid in self.pid_cluster and pid not in self.stopped:
                pids.add(pid)
        return sorted(pids)

    def random_fault(self, kind: str) -> None:
        if kind == "stop":
            self.random_stop()
            return
        # draw a process type (first among those not yet killed, with --cover-types); if none of its processes
        # can die now (no worker holds a lease, the node is still starting, ...), draw again among the others
        left = {r: w for r, w in self.kill_mix.items() if w > 0}
        n_deaths = self.n_deaths
        while left and self.n_deaths == n_deaths:
            owed = sorted(set(left) & self.owed)
            if owed:
                role = self.rng.choice(owed)
            else:
                roles = sorted(left)
                role = self.rng.choices(roles, weights=[left[r] for r in roles])[0]
            del left[role]
            n = len(self.faults)
            self.kill_role(role)
            for f in self.faults[n:]:
                if f.get("kind") in ("kill", "terminate"):
                    self.owed.discard(ROLE_OF_TYPE.get(f.get("role"), f.get("role")))

    def random_stop(self) -> None:
        """SIGSTOP what the stop mix draws — a worker holding a lease, an idle worker, a whole node — for U(L, 3L);
        when nothing of that kind can be stopped now, draw again among the others."""
        if time.time() - self._workers_at > 0.2:
            self.refresh_workers()
        left = {r: w for r, w in self.stop_mix.items() if w > 0}
        n = len(self.faults)
        while left and not any(f["kind"] == "stop" for f in self.faults[n:]):
            owed = sorted(set(left) & self.stops_owed)
            if owed:
                role = self.rng.choice(owed)
            else:
                roles = sorted(left)
                role = self.rng.choices(roles, weights=[left[r] for r in roles])[0]
            del left[role]
            if role == "busy_worker":
                pids = [p for p in self.busy_workers() if not self.node_stopped(p)]
                if pids:
                    self.inject(self.rng.choice(pids), "stop", "random")
            elif role == "idle_worker":
                busy = set(self.busy_workers())
                pids = sorted(
                    p
                    for r in self.roles.values()
                    for p in r.get("qc-worker", [])
                    if p not in busy and p not in self.stopped and not self.node_stopped(p)
                )
                if pids:
                    # frozen and classified like any worker: one found holding a lease after all counts as busy
                    self.inject(self.rng.choice(pids), "stop", "random", require_lease=False)
            else:
                nodes = [k for k, c in enumerate(self.clusters) if k not in self.stopped_nodes and c.exited() is None]
                if nodes:
                    self.stop_node(self.rng.choice(nodes))
        for f in self.faults[n:]:
            if f["kind"] == "stop":
                self.stops_owed.discard(f["role"])

    def spared(self, proc: Proc) -> bool:
        """Whether this generation of `proc` is still within its seeded grace, U(0, --grace) s after its start
        (no fixed grace period: a node, run_maintenance or a web node may die in its first second)."""
        grace = random.Random(f"{self.seed}:grace:{proc.name}:{len(proc.generations)}").uniform(0, self.args.grace)
        return time.time() - proc.started_at < grace

    def node_stopped(self, pid: int) -> bool:
        return any(pid in entry["pids"] for entry in self.stopped_nodes.values())

    def uptime(self, node: int | None, proc: Proc | None = None) -> float | None:
        """Seconds since the current generation of the node (or supervised process) was started."""
        p = proc if proc is not None else (self.clusters[node] if node is not None else None)
        return round(time.time() - p.started_at, 3) if p is not None else None

    def stop_node(self, k: int) -> dict | None:
        """SIGSTOP a whole qcluster node at once (its process group: main, sentinel, pusher, monitor, workers),
        classify what each of its workers held while all are frozen, and SIGCONT them after U(L, 3L)."""
        node = self.clusters[k]
        if node.exited() is not None:
            return None
        t = time.time()
        try:
            os.killpg(node.pid, signal.SIGSTOP)
        except (ProcessLookupError, PermissionError):
            return None
        pids = [node.pid, *sorted(descendants(node.pid, proc_table()))]
        deadline = time.time() + 2
        while time.time() < deadline and any(proc_state(p) not in (None, "T", "t", "Z", "X") for p in pids):
            time.sleep(0.005)
        time.sleep(0.08)  # a COMMIT already sent settles on the server
        workers = [p for p in pids if comm(p) == "qc-worker"]
        held: list[dict] = []
        try:
            for pid in workers:
                held += self.classify(pid)
        except db_errors():
            self.db_lost()
            for pid in pids:
                self.cont(pid)  # the windows cannot be read: nothing is done to it
            self.record(
                {
                    "kind": "aborted",
                    "wanted": "stop",
                    "role": "node",
                    "node": k,
                    "source": "random",
                    "t": time.time(),
                    "why": "database unreachable while frozen",
                }
            )
            return None
        duration = self.rng.uniform(LEASE, 3 * LEASE)
        fault = self.record(
            {
                "kind": "stop",
                "role": "node",
                "source": "random",
                "node": k,
                "cluster": k,
                "pid": node.pid,
                "pids": pids,
                "workers": workers,
                "t_freeze": t,
                "t": t,
                "at": iso(t),
                "held": held,
                "window": worst_window(held),
                "uptime": self.uptime(k),
                "duration": round(duration, 3),
                "t_cont": t + duration,
            }
        )
        self.stopped_nodes[k] = {"cont_at": t + duration, "fault": fault, "pids": set(pids)}
        return fault

    def kill_role(self, role: str) -> None:
        if (
            role in ("busy_worker", "idle_worker", "pusher", "monitor", "sentinel")
            and time.time() - self._workers_at > 0.2
        ):
            self.refresh_workers()  # a worker's death makes its node replace every worker: pids go stale fast
        if role == "busy_worker":
            pids = self.busy_workers()
            if pids:
                self.inject(self.rng.choice(pids), "kill", "random")
                return
            role = "idle_worker"  # nobody holds a lease right now
        if role == "idle_worker":
            busy = set(self.busy_workers())
            pids = sorted(
                p
                for r in self.roles.values()
                for p in r.get("qc-worker", [])
                if p not in busy and p not in self.stopped
            )
            if pids:
                # frozen and classified like any worker: one found holding a lease after all counts as busy
                self.inject(self.rng.choice(pids), "kill", "random", require_lease=False)
            return
        if role == "backend":
            self.terminate_backend()
            return
        if role in ("pusher", "monitor", "sentinel", "main"):
            # from the moment the node is started (issue 33 item 6): also while it starts, before its sentinel has
            # spawned the rest, and within seconds of its last restart
            k = self.rng.randrange(len(self.clusters))
            node = self.clusters[k]
            if role in ("sentinel", "main") and self.spared(node):
                return
            if role == "main":
                pids = [node.pid] if node.exited() is None else []  # not reaped yet: the pid cannot be reused
            else:
                pids = [p for p in self.roles.get(k, {}).get(f"qc-{role}", []) if self.ours(p, f"qc-{role}")]
            if not pids:
                return  # the node is between generations, or has not spawned that process yet
            self.kill_process(
                self.rng.choice(pids),
                "qcluster_main" if role == "main" else role,
                node=k,
                supervised=node.name,
                window=self.node_window(k),
                uptime=self.uptime(k),
            )
        elif role == "maintenance" and self.maintenance.exited() is None and not self.spared(self.maintenance):
            self.kill_process(
                self.maintenance.pid,
                "run_maintenance",
                supervised=self.maintenance.name,
                window="-",
                uptime=self.uptime(None, self.maintenance),
            )
        elif role == "web" and self.web:
            k = self.rng.randrange(len(self.web))
            if self.web[k].exited() is not None or self.spared(self.web[k]):
                return
            self.kill_process(
                self.web[k].pid,
                "web_node",
                node=k,
                supervised=self.web[k].name,
                window="submit_in_flight" if self.submitter and self.submitter.busy(k) else "no_submit",
                uptime=self.uptime(None, self.web[k]),
            )

    def node_window(self, k: int) -> str:
        """The worst window among the runs the node's workers hold (read, not frozen:
        a node-wide death reaches every run of the node at its next step)."""
        held = []
        for pid in self.roles.get(k, {}).get("qc-worker", []):
            if pid not in self.stopped:
                held += self.classify(pid)
        return worst_window(held)

    def kill_process(
        self,
        pid: int,
        role: str,
        *,
        window: str,
        node: int | None = None,
        supervised: str | None = None,
        uptime: float | None = None,
    ) -> dict | None:
        t = time.time()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        return self.record(
            {
                "kind": "kill",
                "role": role,
                "source": "random",
                "pid": pid,
                "node": node,
                "supervised": supervised,
                "window": window,
                "uptime": uptime,
                "held": [],
                "t": t,
                "t_freeze": t,
                "at": iso(t),
            }
        )

    def terminate_backend(self) -> dict | None:
        """pg_terminate_backend of a random backend of the deployment (its
        processes connect as application_name soak-*, never the observer)."""
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute(
                "SELECT pid, application_name, state FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name LIKE 'soak-%%' AND application_name <> 'soak-observer' AND pid <> "
                "pg_backend_pid()"
                " ORDER BY pid"
            )
            rows = cur.fetchall()
            if not rows:
                return None
            bpid, app, state = self.rng.choice(rows)
            t = time.time()
            cur.execute("SELECT pg_terminate_backend(%s)", [bpid])
            ok = cur.fetchone()[0]
        if not ok:
            return None
        return self.record(
            {
                "kind": "terminate",
                "role": "pg_backend",
                "source": "random",
                "backend_pid": bpid,
                "application_name": app,
                "window": state or "unknown",
                "held": [],
                "t": t,
                "at": iso(t),
            }
        )

    def restart_postgres(self) -> None:
        """The one PostgreSQL restart of the soak, under load (immediate mode: every backend dies as in a crash)."""
        from django.db import connection

        window = self.all_windows()
        t = time.time()
        entry = self.pg.restart("immediate")
        connection.close()
        log(f"PostgreSQL restarted in {entry['t_ready'] - t:.2f} s")
        self.record(
            {
                "kind": "pg_restart",
                "role": "postgres_restart",
                "source": "random",
                "window": window,
                "held": [],
                "t": t,
                "at": iso(t),
                "t_ready": entry["t_ready"],
                "mode": entry["mode"],
            }
        )

    def db_lost(self) -> None:
        from django.db import connection

        self.db_outages += 1
        try:
            connection.close()
        except Exception:
            pass

    def deaths(self) -> int:
        return self.n_deaths

    def release_stopped(self, force: bool = False) -> None:
        now = time.time()
        for k, entry in list(self.stopped_nodes.items()):
            if force or now >= entry["cont_at"]:
                del self.stopped_nodes[k]
                for pid in sorted(entry["pids"]):
                    if pid not in self.stopped and self.in_our_sessions(pid):  # a worker stopped on its own waits
                        self.cont(pid)
                entry["fault"]["t_cont"] = now
        for pid, entry in list(self.stopped.items()):
            if force or (now >= entry["cont_at"] and not self.node_stopped(pid)):
                self.cont(pid)
                entry["fault"]["t_cont"] = now
                del self.stopped[pid]

    def in_our_sessions(self, pid: int) -> bool:
        """`pid` is (still) a process of one of the deployment's sessions, whatever its name (pids are reused)."""
        fields = stat(pid)
        sessions = {g.pid for p in self.clusters for g in p.generations}
        return fields is not None and int(fields[3]) in sessions

    def random_cancels(self) -> None:
        from runs.models import Run
        from runs.services.lifecycle import run_cancel

        now = time.time()
        for spec in list(self.cancel_specs):
            if spec.cancel_after is None or spec.run_id is None or now < spec.submitted_at + spec.cancel_after:
                continue
            spec.cancel_after = None
            self.cancel_specs.remove(spec)
            if self.statuses.get(spec.run_id) in TERMINAL:
                continue
            try:
                after = run_cancel(run=Run.objects.get(id=spec.run_id), by="chaos")
            except Exception as exc:
                after = type(exc).__name__
            self.record(
                {
                    "kind": "cancel",
                    "source": "random",
                    "run": spec.run_id,
                    "t": now,
                    "at": iso(now),
                    "status_after": after,
                }
            )

    def operate(self) -> None:
        """The operator: decide every pending approval of a waiting run."""
        from approvals.models import Approval

        now = time.time()
        pending = Approval.objects.filter(status="pending", run__status="WAITING_FOR_APPROVAL").values(
            "id", "run_id", "request_hash", "kind"
        )
        for a in pending:
            aid = str(a["id"])
            if aid in self.pending_decisions:
                continue
            spec = self.by_run.get(str(a["run_id"]))
            k = spec.approvals_seen if spec else 0
            if spec:
                spec.approvals_seen += 1
            rng = random.Random(f"{self.seed}:approval:{spec.index if spec else aid}:{k}")
            self.pending_decisions[aid] = {
                "approval": aid,
                "run": str(a["run_id"]),
                "hash": a["request_hash"],
                "kind": a["kind"],
                "at": now + rng.uniform(0.1, 1.0),
                "approve": rng.random() < self.args.approve_rate,
                "wrong_hash_first": rng.random() < 0.1,
                "twice": rng.random() < 0.2,
                "done": False,
                "cancel_after": False,
                "confirm": None,
            }
            if a["kind"] == "uncertain_side_effect":
                # a live call's answer was dropped or late: approve (re-send, same key), confirm what the operator
                # knows (took effect / did not: nothing is sent again), or reject (the run fails operator_rejected)
                mix = [float(x) for x in self.args.uncertain_mix.split(",")]
                u, acc, choice = rng.random() * sum(mix), 0.0, 3
                for n, w in enumerate(mix):
                    acc += w
                    if u < acc:
                        choice = n
                        break
                self.pending_decisions[aid].update(approve=choice == 0, confirm={1: True, 2: False}.get(choice))
            if spec and spec.plan == "approve+cancel@after_watermark" and k == 0:
                self.pending_decisions[aid].update(approve=True, wrong_hash_first=False, twice=False, cancel_after=True)
        for item in self.pending_decisions.values():
            if item["done"] or now < item["at"]:
                continue
            status = Approval.objects.filter(id=item["approval"]).values_list("status", flat=True).first()
            item["done"] = True  # after the read: a database outage leaves it to the next round
            if status != "pending":  # e.g. another approval of the batch was rejected, or the run was cancelled
                self.decisions.append(
                    {
                        "approval": item["approval"],
                        "run": item["run"],
                        "kind": item["kind"],
                        "expect": "skip",
                        "why": f"no longer pending ({status})",
                        "ok": None,
                        "t": now,
                    }
                )
                continue
            if item["wrong_hash_first"]:
                self.decide(
                    item, item["approve"], "0" * 64, expect="refused", why="wrong-hash", confirm=item["confirm"]
                )
            entry = self.decide(
                item, item["approve"], item["hash"], expect="ok", why="decision", confirm=item["confirm"]
            )
            if entry.get("error") in CLOSING_REFUSALS:
                # approve (a re-send) of an unknown outcome whose run cannot go on — a cancel was requested while it
                # waited, its deadline passed, its budget is spent — is refused (approvals/unknown.py): the operator
                # says what happened instead, which ends the run
                entry.update(
                    expect="refused", why=f"approve of an unknown outcome whose run cannot go on ({entry['error']})"
                )
                crng = random.Random(f"{self.seed}:closing:{item['approval']}")
                u = crng.random()
                took = (u < 1 / 3) if item["kind"] in CONFIRMABLE and u < 2 / 3 else None
                self.decide(item, False, item["hash"], expect="ok", why="after a refused approve", confirm=took)
            if item["cancel_after"]:
                self.cancel_now(item["run"], plan="approve+cancel@after_watermark", point="after_approval")
            if item["twice"]:
                self.decide(item, not item["approve"], item["hash"], expect="refused", why="second")

    def cancel_now(self, run_id: str, *, plan: str, point: str) -> None:
        from runs.models import Run
        from runs.services.lifecycle import run_cancel

        try:
            after = run_cancel(run=Run.objects.get(id=run_id), by="chaos")
        except Exception as exc:
            after = type(exc).__name__
        self.record(
            {
                "kind": "cancel",
                "source": "planned",
                "plan": plan,
                "point": point,
                "run": run_id,
                "t": time.time(),
                "at": iso(time.time()),
                "status_after": after,
            }
        )

    def decide(
        self, item: dict, approve: bool, digest: str, *, expect: str, why: str, confirm: bool | None = None
    ) -> dict:
        """approve / reject (approval_decide) or, with `confirm` set, the operator's
        took_effect knowledge (approval_confirm, `POST /api/approvals/{id}/confirm/`)."""
        from approvals.services import approval_confirm, approval_decide

        decision = "confirm" if confirm is not None else ("approve" if approve else "reject")
        entry = {
            "approval": item["approval"],
            "run": item["run"],
            "kind": item["kind"],
            "decision": decision,
            "expect": expect,
            "why": why,
            "t": time.time(),
        }
        if confirm is not None:
            entry["took_effect"] = confirm
        try:
            if confirm is not None:
                approval_confirm(
                    user=self.operator,
                    approval_id=item["approval"],
                    request_hash=digest,
                    took_effect=confirm,
                    reason=f"chaos {why}",
                    via="api",
                )
            else:
                approval_decide(
                    user=self.operator,
                    approval_id=item["approval"],
                    approve=approve,
                    request_hash=digest,
                    reason=f"chaos {why}",
                    via="api",
                )
            entry["ok"] = True
        except db_errors() as exc:
            # the database went away mid-decision: whether it committed is read back once it is up again
            self.db_lost()
            entry["error"] = f"database: {type(exc).__name__}"
            entry["ok"] = self.committed_anyway(item["approval"], decision) if expect == "ok" else False
            entry["committed_unacknowledged"] = bool(entry["ok"])
            if expect == "ok" and not entry["ok"]:
                item["done"], item["at"] = False, time.time() + 0.5  # not decided: the operator tries again
                entry["expect"] = "retried"
        except Exception as exc:
            entry["ok"] = False
            entry["error"] = getattr(exc, "code", type(exc).__name__)
        self.decisions.append(entry)
        return entry

    def committed_anyway(self, approval_id: str, decision: str) -> bool:
        from approvals.models import Approval

        want = {"approve": "approved", "reject": "rejected", "confirm": "confirmed"}[decision]
        for _ in range(120):
            try:
                return Approval.objects.filter(id=approval_id).values_list("status", flat=True).first() == want
            except db_errors():
                self.db_lost()
                time.sleep(0.25)
        return False

    # -- run -------------------------------------------------------------------------
    def run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        log(f"artifacts in {self.out}")
        (self.out / "args.json").write_text(json.dumps({"argv": sys.argv[1:], **vars(self.args)}, indent=1))

        def stop_submitting(*_):
            self.stopped_submitting = True
            self.stopped_early_at = self.n_deaths
            log(f"SIGUSR1 after {self.n_deaths} deaths: no more submits, draining")

        def terminate(*_):
            raise SystemExit(143)  # stop everything it started (processes, its PostgreSQL) on the way out

        signal.signal(signal.SIGUSR1, stop_submitting)
        signal.signal(signal.SIGTERM, terminate)
        try:
            self.setup_database()
            try:
                self.start_sink()
                self.start_redis()
                self.seed_tenant()
                self.start_processes()
                self.t_start = time.time()
                self.loop()
            except BaseException:
                traceback.print_exc()
                self.release_stopped(force=True)
                self.shutdown()
                raise
            self.shutdown()
            return self.finish()
        finally:
            if self.pg is not None:
                self.pg.stop(keep_log=self.out / "postgres.log")

    def guarded(self, fn, *args) -> None:
        """One job of the loop; the database going away (a terminated backend of
        ours, the restart) costs the job, not the soak."""
        try:
            fn(*args)
        except db_errors():
            self.db_lost()
            time.sleep(0.1)

    def loop(self) -> None:
        a = self.args
        next_kill = time.time() + self.rng.uniform(*self.kill_every) if self.kill_every else None
        next_stop = time.time() + self.rng.uniform(*self.stop_every) if self.stop_every else None
        last_status = last_ops = last_print = last_watch = last_scan = last_sup = 0.0
        cap_at = None
        quiet = False  # every run has ended and nothing is owed: the faults stop, what is stopped goes on
        g = self.guarded
        while True:
            now = time.time()
            if now - last_sup > 0.2:
                self.supervise()
                last_sup = now
            if now - self._workers_at > 1.0:
                self.refresh_workers()
            if now - last_status > 0.25:
                g(self.poll_statuses)
                last_status = now
            unfinished = len(self.open_runs)
            if a.deaths and not self.stopped_submitting and self.deaths() >= a.deaths:
                self.stopped_submitting = True
                log(f"{self.deaths()} deaths injected: no more submits, draining (the faults go on)")
            open_specs = 0 if self.stopped_submitting else len(self.specs) - self.next_spec
            if open_specs or self.web_pending:
                g(self.submit_more, unfinished)
                if self.t_first_submit:
                    cap_at = cap_at or (self.t_first_submit + a.duration_cap)
            elif self.t_drain is None:
                self.t_drain = now
                self.drain_deaths_from = self.deaths()
            if not a.no_faults:
                # the unfinished runs' pause files every tick; the whole folder every second
                # (a zombie may pause at a point of a run that has ended meanwhile)
                full = now - last_scan > 1.0
                g(self.handle_markers, full)
                last_scan = now if full else last_scan
                g(self.release_cancels)
                if now - last_watch > 0.05:
                    g(self.watch_after_result)
                    last_watch = now

                g(self.random_cancels)
                # The random faults go on through the drain (issue 33 item 6): the deployment must bring every
                # run to its end while processes keep dying; they stop only once every run has ended.
                if next_kill and now >= next_kill and not quiet:
                    g(self.random_fault, "kill")
                    next_kill = now + self.rng.uniform(*self.kill_every)
                if next_stop and now >= next_stop and not quiet:
                    g(self.random_fault, "stop")
                    next_stop = now + self.rng.uniform(*self.stop_every)
                self.release_stopped()
                share = (self.deaths() / a.deaths) if a.deaths else (self.n_submitted / max(1, len(self.specs)))
                late = self.stopped_submitting or self.t_drain is not None  # whatever is still owed is due now
                if self.pg and not a.no_pg_restart and not self.pg_restart_done:
                    if share >= self.pg_restart_at or late:
                        self.pg_restart_done = True
                        g(self.restart_postgres)
                g(self.outside_restarts, share, late)
            if now - last_ops > 0.2:
                g(self.operate)
                last_ops = now
            if now - last_print > 10:
                last_print = now
                counts = Counter(self.statuses.get(r, "-") for r in self.open_runs)
                kinds = Counter(
                    f.get("role", f["kind"])
                    for f in self.faults
                    if f["kind"] in ("kill", "terminate", "pg_restart", "redis_restart")
                )
                log(
                    f"t={now - self.t_start:5.0f}s submitted {self.n_submitted}/{len(self.specs)} open {dict(counts)} "
                    f"deaths {self.deaths()} "
                    f"{dict(kinds)} stops {sum(1 for f in self.faults if f['kind'] == 'stop')} restarts "
                    f"{len(self.exits)} "
                    f"db outages {self.db_outages} decisions {sum(1 for d in self.decisions if d.get('ok'))}"
                    + (" (draining)" if self.t_drain else "")
                )
            owed = bool(
                self.owed or self.stops_owed or self.sink_restart_at or self.sink_armed or self.redis_restart_owed
            ) or bool(self.pg and not a.no_pg_restart and not a.no_faults and not self.pg_restart_done)
            if not open_specs and not self.web_pending and unfinished == 0 and not owed and not quiet:
                quiet = True
                self.release_stopped(force=True)
                log("every run is terminal: the random faults stop")
            # end only once the supervisor has started again what the last kills ended
            settled = all(p.exited() is None for p in self.supervised()) and (
                not self.faults or now - self.faults[-1].get("t", 0.0) > 1.0
            )
            if quiet and settled and not self.stopped and not self.stopped_nodes:
                break
            if cap_at and now > cap_at:
                log(f"duration cap of {a.duration_cap}s reached with {unfinished} unfinished runs")
                break
            time.sleep(0.02)
        self.t_end = time.time()

    def outside_restarts(self, share: float, late: bool) -> None:
        """The effect sink (armed first: the next POST is held, so a request is in flight when it dies) and Redis,
        each restarted at its seeded share of the soak."""
        now = time.time()
        assert self.sink is not None
        if self.sink_armed is None and self.sink_restart_at and (share >= self.sink_restart_at[0] or late):
            self.sink_restart_at.pop(0)
            self.sink.new_records()  # read from here on
            self.sink.arm()
            self.sink_armed = {"t": now, "deadline": now + 20.0}
        if self.sink_armed is not None:
            held = [r for r in self.sink.new_records() if r.get("held_for_restart")]
            if held or now > self.sink_armed["deadline"]:
                self.restart_sink(held[0] if held else None)
        if self.redis is not None and self.redis_restart_owed and (share >= self.redis_restart_at or late):
            self.redis_restart_owed = False
            self.restart_redis()

    def restart_sink(self, held: dict | None) -> None:
        assert self.sink is not None
        armed, self.sink_armed = self.sink_armed, None
        entry = self.sink.restart()
        log(
            f"effect sink restarted ({'a POST held in flight' if held else 'no POST came to hold'}; down "
            f"{entry['t_ready'] - entry['t_kill']:.2f} s)"
        )
        self.record(
            {
                "kind": "sink_restart",
                "source": "random",
                "t": entry["t_kill"],
                "at": iso(entry["t_kill"]),
                "t_dead": entry["t_dead"],
                "t_ready": entry["t_ready"],
                "armed_at": armed["t"] if armed else None,
                "held_post": {k: held.get(k) for k in ("key", "attempt", "t_ns")} if held else None,
            }
        )

    def restart_redis(self) -> None:
        """The one Redis restart of the soak, under load (SIGKILL, then started again empty on its port)."""
        assert self.redis is not None
        window = self.all_windows()
        entry = self.redis.restart()
        log(
            f"Redis restarted in {entry['t_ready'] - entry['t_kill']:.2f} s "
            f"({entry['connected_clients_before']} clients connected before)"
        )
        self.record(
            {
                "kind": "redis_restart",
                "role": "redis_restart",
                "source": "random",
                "window": window,
                "held": [],
                "t": entry["t_kill"],
                "at": iso(entry["t_kill"]),
                **entry,
            }
        )

    def all_windows(self) -> str:
        """The worst window among the runs every node's workers hold (read, not frozen)."""
        try:
            held = []
            for r in self.roles.values():
                for pid in r.get("qc-worker", []):
                    held += self.classify(pid)
            return worst_window(held)
        except db_errors():
            self.db_lost()
            return "-"

    def shutdown(self) -> None:
        self.release_stopped(force=True)
        for name in os.listdir(self.fault_dir) if self.fault_dir.exists() else []:
            if name.endswith(".paused"):
                (self.fault_dir / (name[: -len(".paused")] + ".go")).touch()
        time.sleep(1.5)  # let released zombies record run.fenced
        if self.submitter is not None:
            self.submitter.close()
        for p in self.supervised():
            p.stop()
        if self.sink is not None:
            self.sink.stop()
        if self.redis is not None:
            self.redis.stop()

    # -- the snapshot and the report -------------------------------------------------
    def snapshot(self) -> dict:
        from runs.runtime.resume import MAX_LEASE_EXPIRATIONS

        def annotate(r: dict) -> None:
            spec = self.by_run.get(r["id"])
            if spec:
                r.update(
                    index=spec.index, plan=spec.plan, agent=spec.agent, posts=spec.posts, submitted_at=spec.submitted_at
                )

        return take_snapshot(
            annotate=annotate,
            meta={
                "runs_submitted": sum(1 for s in self.specs if s.run_id),
                "runs_planned": len(self.specs),
                "seed": self.seed,
                "t_first_submit": self.t_first_submit,
                "t_end": getattr(self, "t_end", None),
                "lease_seconds": LEASE,
                "status_polls": self.polls,
                "observed_waiting_with_lease": self.waiting_with_lease[:100],
                "max_lease_expirations": MAX_LEASE_EXPIRATIONS,
                "reconciler": False,  # env() drops AGENTRT_RECONCILER: no global reconciler
                # ... but the reconciled runs' tool reconciles its own calls (tests/chaos/tools.py), by this rule
                "reconciled_tools": [RECONCILED_TOOL] if any(s.reconciled for s in self.specs) else [],
                "reconcile_rule": {"seed": str(self.seed), "conflict_share": self.args.conflict_share},
                "t_drain": self.t_drain,
                "deaths_before_drain": self.drain_deaths_from if self.t_drain else None,
                "sink_delay_s": self.args.sink_delay,
                "post_timeout": POST_TIMEOUT,
                "redis": {"port": self.redis.port, "restarts": self.redis.restarts} if self.redis else None,
                "sink_restarts": self.sink.restarts if self.sink else [],
                "supervisor": self.exits,
                "worker_nodes": {str(k): v for k, v in self.pid_node.items()},
                "web_submits": self.submitter.log if self.submitter else [],
                "service_submits": [
                    {"index": s.index, "attempts": getattr(s, "service_attempts", 0)}
                    for s in self.specs
                    if s.via == "service" and s.run_id
                ],
                "submit_errors": [
                    {"index": s.index, "error": s.submit_error} for s in self.specs if getattr(s, "submit_error", None)
                ],
                "db_outages_seen_by_the_soak": self.db_outages,
                "private_postgres": bool(self.pg),
                "pg_restarts": self.pg.restarts if self.pg else [],
            },
        )

    def finish(self) -> int:
        from tests.chaos.checker import check

        snap = self.snapshot()
        snap["meta"]["process_logs"] = self.log_summary()  # the checker judges unhandled errors too
        sink = read_jsonl(self.out / "sink.jsonl")
        reconciles = read_jsonl(self.out / "reconcile.jsonl")
        (self.out / "snapshot.json").write_text(json.dumps(snap, default=str))
        with open(self.out / "faults.jsonl", "w") as fh:
            for f in self.faults:
                fh.write(json.dumps(f, default=str) + "\n")
        with open(self.out / "decisions.jsonl", "w") as fh:
            for d in self.decisions:
                fh.write(json.dumps(d, default=str) + "\n")
        report = check(snap, sink, self.faults, self.decisions, reconciles)
        report["config"] = {
            "command": "python -m tests.chaos.soak " + " ".join(sys.argv[1:])
            if sys.argv and sys.argv[0].endswith("soak.py")
            else None,
            "runs": self.args.runs,
            "seed": self.seed,
            "workers": self.workers,
            "clusters": self.n_clusters,
            "lease_seconds": LEASE,
            "max_inflight": self.max_inflight,
            "planned_fraction": self.args.planned_fraction,
            "kill_every": self.kill_every,
            "stop_every": self.stop_every,
            "cancel_rate": self.args.cancel_rate,
            "approve_rate": self.args.approve_rate,
            "no_faults": self.args.no_faults,
            "database": self.db_url,
            "sink_drop_rate": self.args.sink_drop_rate,
            "sink_delay_rate": self.args.sink_delay_rate,
            "sink_delay": self.args.sink_delay,
            "post_timeout": POST_TIMEOUT,
            "uncertain_mix": self.args.uncertain_mix,
            "duration_cap": self.args.duration_cap,
            "wall_s": round(self.t_end - self.t_start, 1),
            "artifacts": str(self.out),
            "plans": dict(Counter(s.plan for s in self.specs)),
            **self.fleet_config(),
        }
        report["planned"] = self.planned_summary()
        if self.args.baseline:
            base = json.loads(Path(self.args.baseline).read_text())
            b, t = (
                (base.get("throughput") or {}).get("runs_per_min"),
                (report.get("throughput") or {}).get("runs_per_min"),
            )
            report["baseline"] = {
                "report": self.args.baseline,
                "runs": base.get("runs"),
                "runs_per_min": b,
                "ratio": round(t / b, 2) if b and t else None,
                "run_latency_s": base.get("run_latency_s"),
            }
        report["logs"] = {
            name: {k: v for k, v in x.items() if k != "traceback_list"}
            for name, x in snap["meta"]["process_logs"].items()
        }
        (self.out / "report.json").write_text(json.dumps(report, indent=2, default=str))
        md = render_markdown(report)
        (self.out / "report.md").write_text(md)
        if self.args.bundle:
            from tests.chaos.bundle import pack
            from tests.chaos.report import from_bundle

            info = pack(self.out, Path(self.args.bundle))
            log(f"bundle {self.args.bundle}: {info['bytes']:,} bytes {info['members']}")
            _, md = from_bundle(Path(self.args.bundle))
        if self.args.report:
            Path(self.args.report).write_text(md)
        log(f"report: {self.out / 'report.md'}")
        print(md)
        if report["violations"]:
            return 1
        if self.args.require_windows and not all(report["kill_windows_hit"].values()):
            return 3
        return 0

    def fleet_config(self) -> dict:
        a = self.args
        return {
            "kill_mix": a.kill_mix,
            "web_nodes": a.web_nodes,
            "web_fraction": a.web_fraction,
            "deaths_target": a.deaths,
            "private_postgres": self.pg is not None,
            "pg_restart": not a.no_pg_restart and self.pg is not None,
            "pg_restart_at": self.pg_restart_at,
            "stopped_early_at_deaths": self.stopped_early_at,
            "grace": a.grace,
            "stop_mix": a.stop_mix,
            "reconciled_fraction": a.reconciled_fraction,
            "reconciled_runs": sum(1 for s in self.specs if s.reconciled and s.run_id),
            "conflict_share": a.conflict_share,
            "sink_restarts": a.sink_restarts,
            "redis": not a.no_redis,
            "redis_restart": self.redis is not None and not a.no_redis_restart and not a.no_faults,
            "faults_through_drain": True,
        }

    def planned_summary(self) -> dict:
        landed = Counter()
        for f in self.faults:
            if f.get("source") == "planned" and f["kind"] in ("kill", "stop", "cancel"):
                landed[f["plan"]] += 1
        wanted = Counter(s.plan for s in self.specs if s.plan != "none" and s.run_id)
        return {plan: {"runs": wanted[plan], "landed": landed[plan]} for plan in sorted(wanted)}

    def log_summary(self) -> dict:
        out = {}
        for p in self.supervised():
            try:
                text = p.log_path.read_text(errors="replace")
            except OSError:
                continue
            lines = text.splitlines()
            out[p.name] = {
                "application_name": p.env.get("PGAPPNAME"),
                "traceback_list": parse_tracebacks(lines),
                # django-q2 logs each worker it starts: the node of a worker
                # that lived between two process-table reads
                "worker_pids": parse_worker_pids(lines),
                "tracebacks": sum(1 for line in lines if line.startswith("Traceback")),
                "errors": sum(1 for line in lines if " ERROR " in line or " CRITICAL " in line),
                "unhandled_run_errors": sum(1 for line in lines if "unhandled error" in line),
                "reincarnated": sum(1 for line in lines if "reincarnated" in line),
            }
        return out


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return Soak(args).run()


if __name__ == "__main__":
    sys.exit(main())
