"""`make cluster`: several nodes on one PostgreSQL and one Redis, supervised
as one unit — N worker nodes (`qcluster`), web nodes (daphne, one port
each) and one `run_maintenance`. It is the multi-node deployment of
deploy/README.md on one machine, for trying it, and for the rolling-deploy
and scaling benchmarks (bench/rolling_deploy.py, bench/scaling.py).

1. Refuses anything but PostgreSQL (`DATABASE_URL`): several processes on
   one SQLite file is the embedded default's job (`make run`), not a cluster.
2. Applies the migrations, then starts every node (ops/supervise.py: each in
   its own session, stopped by the kernel if this command dies).
3. Waits until each node is ready — a web node answers `/readyz` with 200, a
   worker node has its sentinel, pusher, monitor and all its workers, the
   maintenance process has run for a second — and exits 1, stopping the
   rest, if one exits before that or is not ready in `--start-timeout`.
4. While running it restarts any node that exits, whatever the reason (as
   systemd's `Restart=always` does), after `--restart-delay`. That is what
   a rolling deploy needs: SIGTERM one node's main process (`pid` in the
   state file), it drains and exits, it is started again. A node that exits
   `--give-up-after` times in a row without becoming ready stops the whole
   cluster with exit code 1. A worker node's main process that exits may
   leave its sentinel draining on its own; that session is left to drain
   and killed only at the stop, after the grace.
5. SIGTERM, SIGHUP or Ctrl-C stops everything (SIGTERM to each node's main
   process: worker nodes drain, their runs yield back to the queue), waits
   up to `--stop-grace`, then SIGKILLs what is left; exit 0.

`--state-file` (JSON, rewritten at every change) names each node's role,
pid, port, start and ready times, restarts and last exit code: what an
operator or a benchmark needs to find a node's main process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import BinaryIO

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from ops.supervise import (
    STOP_GRACE_SECONDS,
    STOP_SIGNALS,
    answers,
    comm,
    descendants,
    session_alive,
    start_child,
    stop_children,
    watch_parent,
)
from runs.clock import CLOCK

WORKER_ROLES = ("qc-sentinel", "qc-pusher", "qc-monitor")


class Node:
    def __init__(
        self,
        name: str,
        role: str,
        argv: list[str],
        env: dict,
        *,
        port: int | None = None,
        workers: int = 0,
        log_dir: Path | None = None,
    ):
        self.name, self.role, self.argv, self.env = name, role, argv, env
        self.port, self.workers = port, workers
        self.log_path = log_dir / f"{name}.log" if log_dir else None
        self.proc: subprocess.Popen | None = None
        self.log: BinaryIO | None = None
        self.started_at: float | None = None
        self.ready_at: float | None = None
        self.restarts = 0
        self.failed_starts = 0  # exits in a row before becoming ready
        self.last_exit: int | None = None
        self.next_start: float | None = None

    def start(self) -> None:
        if self.log_path is not None and self.log is None:
            self.log = open(self.log_path, "ab")
        self.proc = start_child(self.argv, self.env, stdout=self.log, cwd=settings.BASE_DIR)
        self.started_at = CLOCK.monotonic()
        self.ready_at = None
        self.next_start = None

    def ready(self) -> bool:
        if self.ready_at is not None:
            return True
        if self.proc is None or self.started_at is None:
            return False
        if self.role == "web":
            ok = self.port is not None and answers(self.port, "/readyz")
        elif self.role == "worker":
            names = [comm(p) for p in descendants(self.proc.pid)]
            ok = all(r in names for r in WORKER_ROLES) and names.count("qc-worker") >= self.workers
        else:
            ok = CLOCK.monotonic() - self.started_at >= 1.0
        if ok:
            self.ready_at = CLOCK.monotonic()
        return ok

    def state(self, t0_wall: float, t0_mono: float) -> dict:
        def wall(t):
            return None if t is None else round(t0_wall + (t - t0_mono), 3)

        return {
            "name": self.name,
            "role": self.role,
            "pid": self.proc.pid if self.proc else None,
            "port": self.port,
            "running": bool(self.proc and self.proc.poll() is None),
            "started_at": wall(self.started_at),
            "ready_at": wall(self.ready_at),
            "restarts": self.restarts,
            "last_exit": self.last_exit,
            "log": str(self.log_path) if self.log_path else None,
        }


class Command(BaseCommand):
    help = "Start N worker nodes, web nodes and maintenance on one PostgreSQL and one Redis, supervised as one unit."

    def add_arguments(self, parser):
        parser.add_argument("--workers", type=int, default=2, help="worker nodes (qcluster processes); default 2")
        parser.add_argument(
            "--worker-processes",
            type=int,
            default=None,
            help="workers per node (AGENTRT_WORKERS); default: the environment's, else 2",
        )
        parser.add_argument("--web", type=int, default=2, help="web nodes (daphne); default 2")
        parser.add_argument(
            "--port",
            type=int,
            default=int(os.environ.get("PORT", 8000)),
            help="first web node's port; node k listens on port + k - 1 (default 8000)",
        )
        parser.add_argument("--bind", default="127.0.0.1", help="address the web nodes bind (default 127.0.0.1)")
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=None,
            help="worker node k serves its histograms on this port + k - 1 (AGENTRT_METRICS_PORT)",
        )
        parser.add_argument(
            "--no-maintenance", action="store_true", help="start no run_maintenance (another host runs it)"
        )
        parser.add_argument(
            "--log-dir", default=None, help="each node's output to DIR/NAME.log (default: this terminal)"
        )
        parser.add_argument(
            "--state-file", default=None, help="JSON with every node's pid, port and restarts, kept current"
        )
        parser.add_argument(
            "--start-timeout", type=float, default=120.0, help="seconds for every node to be ready (default 120)"
        )
        parser.add_argument(
            "--restart-delay", type=float, default=1.0, help="seconds before a node that exited is started again"
        )
        parser.add_argument(
            "--give-up-after",
            type=int,
            default=5,
            help="a node that exits this many times in a row before it is ready stops the cluster (exit 1)",
        )
        parser.add_argument(
            "--stop-grace",
            type=float,
            default=STOP_GRACE_SECONDS,
            help=f"seconds the nodes get to drain on stop before they are killed (default {STOP_GRACE_SECONDS})",
        )

    def handle(self, *args, **opts):
        if connection.vendor != "postgresql":
            raise CommandError(
                "the cluster runs on PostgreSQL: set DATABASE_URL=postgres://... "
                "(several processes on one SQLite file is `make run`'s embedded default, not a cluster)"
            )
        for opt, low in (("workers", 1), ("web", 0)):
            if opts[opt] < low:
                raise CommandError(f"--{opt} must be at least {low}")
        if opts["worker_processes"] is not None and opts["worker_processes"] < 1:
            raise CommandError("--worker-processes must be at least 1")
        if not os.environ.get("REDIS_URL"):
            self.stderr.write(
                "note: REDIS_URL is not set: live pages of one web node will not hear another node's runs "
                "(they fall back to polling), and throttles and socket limits are per process"
            )
        self.stopping = None

        def on_signal(signum, frame):
            self.stopping = self.stopping or signal.Signals(signum).name

        for sig in STOP_SIGNALS:
            signal.signal(sig, on_signal)
        parent_stop = watch_parent()  # under `make cluster`: a stop make takes but does not pass on
        self.stop_reason = lambda: self.stopping or parent_stop()
        self.opts = opts
        self.log_dir = Path(opts["log_dir"]) if opts["log_dir"] else None
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        self.state_file = Path(opts["state_file"]) if opts["state_file"] else None
        self.t0_wall, self.t0_mono = CLOCK.now().timestamp(), CLOCK.monotonic()
        call_command("migrate", verbosity=0, interactive=False)
        connection.close()  # the nodes have their own; this process only supervises
        self.nodes = self._plan()
        self.leftovers: list[int] = []  # sessions of exited worker nodes whose sentinel may still drain
        reason = None
        try:
            reason = self._supervise()
        finally:
            for sig in STOP_SIGNALS:  # a second signal must not cut the drain short
                signal.signal(sig, signal.SIG_IGN)
            started = [(n, n.proc) for n in self.nodes if n.proc is not None]
            stop_children(
                [proc for _, proc in started],
                [n.name for n, _ in started],
                self._say,
                grace=opts["stop_grace"],
                leftovers=[s for s in self.leftovers if s not in {proc.pid for _, proc in started}],
            )
            self._write_state()
            for n in self.nodes:
                if n.log:
                    n.log.close()
        if reason:
            self.stderr.write(f"cluster: {reason}; stopped the rest")
            sys.exit(1)

    # -- the nodes -----------------------------------------------------------------
    def _plan(self) -> list[Node]:
        o = self.opts
        manage = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py")]
        base = dict(os.environ)
        if self.log_dir:
            base["PYTHONUNBUFFERED"] = "1"
        workers = o["worker_processes"] or int(os.environ.get("AGENTRT_WORKERS") or 2)
        # A tenant's share of the leases: half the deployment's workers (each node knows only its own).
        base.setdefault("AGENTRT_TENANT_MAX_RUNNING", str(max(1, o["workers"] * workers // 2)))
        nodes = []
        for k in range(1, o["web"] + 1):
            port = o["port"] + k - 1
            argv = [sys.executable, "-m", "daphne", "-b", o["bind"], "-p", str(port), "agentrt_site.asgi:application"]
            nodes.append(Node(f"web-{k}", "web", argv, dict(base), port=port, log_dir=self.log_dir))
        for k in range(1, o["workers"] + 1):
            env = dict(base, AGENTRT_WORKERS=str(workers))
            if o["metrics_port"]:
                env["AGENTRT_METRICS_PORT"] = str(o["metrics_port"] + k - 1)
            if env.get("PROMETHEUS_MULTIPROC_DIR"):  # one directory per node: a starting node empties its own
                env["PROMETHEUS_MULTIPROC_DIR"] = str(Path(env["PROMETHEUS_MULTIPROC_DIR"]) / f"worker-{k}")
            nodes.append(
                Node(f"worker-{k}", "worker", manage + ["qcluster"], env, workers=workers, log_dir=self.log_dir)
            )
        if not o["no_maintenance"]:
            nodes.append(
                Node("maintenance", "maintenance", manage + ["run_maintenance"], dict(base), log_dir=self.log_dir)
            )
        return nodes

    def _supervise(self) -> str | None:  # noqa: C901 - one loop over every node's restart, drain and stop rule
        o = self.opts
        for n in self.nodes:
            if self.stop_reason():
                break
            n.start()
            assert n.proc is not None  # start() sets it
            self._say(f"{n.name} started (pid {n.proc.pid}{f', port {n.port}' if n.port else ''})")
        self._write_state()
        deadline = CLOCK.monotonic() + o["start_timeout"]
        announced = False
        while not (stop := self.stop_reason()):
            changed = False
            now = CLOCK.monotonic()
            for n in self.nodes:
                if n.proc is None:
                    continue
                if n.next_start is not None:
                    if now >= n.next_start:
                        n.restarts += 1
                        n.start()
                        self._say(f"{n.name} restarted (pid {n.proc.pid}, restart {n.restarts})")
                        changed = True
                    continue
                rc = n.proc.poll()
                if rc is not None:
                    n.last_exit = rc
                    changed = True
                    if not announced:
                        return f"{n.name} could not start (exit code {rc}{self._tail(n)})"
                    if n.ready_at is None:
                        n.failed_starts += 1
                        if n.failed_starts >= o["give_up_after"]:
                            return (
                                f"{n.name} exited {n.failed_starts} times in a row before it was ready "
                                f"(last exit code {rc})"
                            )
                    else:
                        n.failed_starts = 0
                    if n.role == "worker" and session_alive(n.proc.pid):
                        self.leftovers.append(n.proc.pid)  # its sentinel drains the old cluster on its own
                    self._say(f"{n.name} exited with code {rc}; restarting in {o['restart_delay']:g} s")
                    n.next_start = now + o["restart_delay"]
                    continue
                if n.ready_at is None and n.ready():
                    changed = True
                    n.failed_starts = 0
                    if announced and n.proc is not None and n.ready_at is not None and n.started_at is not None:
                        self._say(f"{n.name} ready (pid {n.proc.pid}) after {n.ready_at - n.started_at:.1f} s")
            if not announced:
                if all(n.ready_at is not None for n in self.nodes):
                    announced = True
                    self._announce()
                elif CLOCK.monotonic() > deadline:
                    late = [n.name for n in self.nodes if n.ready_at is None]
                    return f"not ready after {o['start_timeout']:g} s: {', '.join(late)}"
            self.leftovers = [s for s in self.leftovers if session_alive(s)]
            if changed:
                self._write_state()
            CLOCK.sleep(0.2)
        self._say(f"{stop}: stopping {len(self.nodes)} nodes (worker nodes drain: their runs yield back to the queue)")
        return None

    def _announce(self) -> None:
        webs = [n for n in self.nodes if n.role == "web"]
        workers = [n for n in self.nodes if n.role == "worker"]
        self.stdout.write(
            self.style.SUCCESS(
                f"\nagentrt cluster is running: {len(workers)} worker node(s) x {workers[0].workers} workers, "
                f"{len(webs)} web node(s), "
                f"{'maintenance' if any(n.role == 'maintenance' for n in self.nodes) else 'no maintenance'}, "
                f"database {connection.settings_dict['NAME']}"
            )
        )
        for n in webs:
            self.stdout.write(f"  {n.name}: http://{self.opts['bind']}:{n.port}/   (/readyz, /metrics)")
        if self.state_file:
            self.stdout.write(f"  state: {self.state_file}")
        self.stdout.write(
            "SIGTERM a node's pid to restart it (it drains first); Ctrl-C, SIGTERM or SIGHUP here stops them all.\n"
        )

    def _tail(self, n: Node) -> str:
        if not n.log_path:
            return ""
        try:
            lines = n.log_path.read_text(errors="replace").splitlines()[-5:]
        except OSError:
            return ""
        return "; its log ends:\n    " + "\n    ".join(lines) if lines else ""

    def _say(self, text: str) -> None:
        self.stdout.write(f"cluster: {text}")
        self.stdout.flush()

    def _write_state(self) -> None:
        if not self.state_file:
            return
        state = {
            "supervisor": os.getpid(),
            "database": connection.settings_dict["NAME"],
            "nodes": [n.state(self.t0_wall, self.t0_mono) for n in self.nodes],
        }
        tmp = self.state_file.with_suffix(self.state_file.suffix + ".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        os.replace(tmp, self.state_file)
