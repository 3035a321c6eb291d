"""`make run`: migrate, create the demo tenant, operator and agents, start
web + worker + maintenance, submit the demo runs (once: later starts find
them), print where to look. A port already in use stops it before anything
starts, saying how to pick another (`PORT=N make run`, `--port N`).

Ctrl-C, SIGTERM (docker stop, systemd, a closing terminal's supervisor) and
SIGHUP each stop everything it started: the worker drains (its runs yield
back to the queue), then the command exits. Under `make run` (whose recipe
`exec`s this command) the same holds for a signal sent to make alone: make
passes a SIGTERM on, and a SIGHUP or SIGINT it keeps to itself is seen in
make's signal handlers (ops.supervise.watch_parent); if make dies outright,
the kernel sends this command a SIGTERM. Each child runs in its own
session, so a signal reaches it only through this command, once; and each is
told by the kernel to stop if this command dies without a chance to (SIGKILL).
The supervision is ops/supervise.py, shared with `manage.py cluster`.
A child that dies on its own stops the rest, and the command exits 1 for
whatever supervises it."""

import json
import os
import signal
import socket
import sys
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import BaseCommand

from ops.supervise import STOP_SIGNALS, answers, start_child, stop_children, watch_parent
from runs.clock import CLOCK
from runs.services import agent_load, run_submit, tenant_create

DEMO = Path(settings.BASE_DIR) / "demo"


class _Stop(Exception):
    pass


class _WebDown(Exception):
    pass


def port_free(port: int) -> bool:
    """Whether the web server could bind 127.0.0.1:`port` now (SO_REUSEADDR, as daphne binds)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Command(BaseCommand):
    help = "Start agentrt with a demo tenant, operator and agents (what `make run` does)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--port",
            type=int,
            default=int(os.environ.get("PORT", 8000)),
            help="the web server's port on 127.0.0.1 (default: $PORT, else 8000; `PORT=8001 make run`)",
        )
        parser.add_argument("--no-serve", action="store_true", help="set up and submit, but start no processes")

    def handle(self, *args, **opts):
        def on_signal(signum, frame):
            raise _Stop(signal.Signals(signum).name)

        for sig in STOP_SIGNALS:
            signal.signal(sig, on_signal)
        self.parent_stop = watch_parent()
        try:
            self._serve(opts)
        except _Stop as stop:
            self.stdout.write(f"{stop.args[0]}: stopped before anything was started")

    def _serve(self, opts):
        port = opts["port"]
        if not opts["no_serve"] and not port_free(port):
            # Before anything starts: nothing to stop, and no "agentrt is running" over a server that cannot bind.
            self.stderr.write(
                f"agentrt: port {port} on 127.0.0.1 is already in use (another `make run`, or another server).\n"
                f"Stop it, or pick another port: PORT={port + 1} make run   (or: manage.py demo --port {port + 1})"
            )
            sys.exit(1)
        call_command("migrate", verbosity=0)
        # The demo's well-known operator/operator exists only here: tenant_create
        # sets the password without the validators (AUTH_PASSWORD_VALIDATORS
        # refuse it), on purpose and nowhere else — create_tenant validates.
        tenant, operator = tenant_create(name="demo", username="operator", password="operator", operator=True)
        # The demo operator also publishes agents over REST and edits the tenant's policy floor.
        operator.user_permissions.add(
            *Permission.objects.filter(codename__in=["publish_agent", "change_tenant", "view_tenant"])
        )
        for path in sorted(DEMO.glob("*.json")):
            definition = json.loads(path.read_text())
            for turn in definition["model"].get("turns", []):
                for call in turn.get("tool_calls", []):
                    url = call.get("arguments", {}).get("url")
                    if isinstance(url, str):
                        call["arguments"]["url"] = url.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
            agent_load(tenant=tenant, definition=definition)
        env = dict(os.environ)
        env["AGENTRT_DEMO"] = "1"  # the web process mounts /demo/hook only under the demo
        env.setdefault("AGENTRT_HTTP_TOOL_ALLOWED_HOSTS", f"127.0.0.1:{port}")
        env.setdefault("AGENTRT_LOG_LEVEL", "INFO")
        procs = []
        names = ["web", "worker", "maintenance"]
        if opts["no_serve"]:
            self._submit_and_print(tenant, port)
            return
        manage = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py")]
        reason = None
        try:
            procs.append(
                start_child(
                    [
                        sys.executable,
                        "-m",
                        "daphne",
                        "-b",
                        "127.0.0.1",
                        "-p",
                        str(port),
                        "agentrt_site.asgi:application",
                    ],
                    env,
                )
            )
            procs.append(start_child(manage + ["qcluster"], env))
            procs.append(start_child(manage + ["run_maintenance"], env))
            if not self._wait_for_web(port, procs[0]):
                # The server did not come up (the port taken meanwhile, a crash): say so, never "running".
                code = procs[0].poll()
                raise _WebDown(f"the web server on port {port} did not start" + (f" (exit {code})" if code else ""))
            self._submit_and_print(tenant, port)
            while all(p.poll() is None for p in procs):
                self._check_parent()
                CLOCK.sleep(0.2)
            died = next(n for n, p in zip(names, procs, strict=True) if p.poll() is not None)
            reason = f"{died} exited with code {procs[names.index(died)].returncode}"
        except _WebDown as down:
            reason = f"{down.args[0]}: if the port is taken, pick another: PORT={port + 1} make run"
        except _Stop as stop:
            self.stdout.write(f"\n{stop.args[0]}: stopping web, worker and maintenance (the worker yields its runs)")
        finally:
            for sig in STOP_SIGNALS:  # a second signal must not cut the drain short
                signal.signal(sig, signal.SIG_IGN)
            stop_children(procs, names[: len(procs)], self.stdout.write)
        if reason:
            self.stderr.write(f"{reason}; stopped the rest")
            sys.exit(1)

    def _check_parent(self) -> None:
        """Stop as on a signal when `make`, our parent, took one it does not pass on (ops.supervise.watch_parent)."""
        reason = self.parent_stop()
        if reason:
            raise _Stop(reason)

    def _wait_for_web(self, port, web, timeout: float = 60.0) -> bool:
        """Announce the URLs once they answer: a web server that has bound its
        port may still be starting (and not yet handling a stop signal).
        False when it exited or did not answer within `timeout`."""
        deadline = CLOCK.monotonic() + timeout
        while web.poll() is None and CLOCK.monotonic() < deadline:
            self._check_parent()
            if answers(port, "/healthz"):
                return True
            CLOCK.sleep(0.1)
        return False

    def _submit_and_print(self, tenant, port):
        # The demo's two runs are submitted once: later starts find them by their Idempotency-Keys (the same
        # agent and input), so each `make run` shows the same two runs instead of adding two more.
        reader, _ = run_submit(
            tenant=tenant, agent="reader", input="Check that the service is healthy.", idempotency_key="demo-reader"
        )
        release, _ = run_submit(
            tenant=tenant, agent="release-bot", input="Ship release 1.4.2.", idempotency_key="demo-release-bot"
        )
        release.refresh_from_db(fields=["status"])
        base = f"http://127.0.0.1:{port}"
        self.stdout.write(self.style.SUCCESS("\nagentrt is running on the embedded default (SQLite)."))
        self.stdout.write(f"  live runs: {base}/runs/            login operator / operator")
        ended = release.status in ("COMPLETED", "FAILED", "CANCELLED")
        waiting = f"ended {release.status}" if ended else "asks approval for its http_post"
        self.stdout.write(f"  waiting:   {base}/runs/{release.id}/   (release-bot {waiting})")
        self.stdout.write(f"  approvals: {base}/admin/approvals/approval/")
        self.stdout.write(f"  API:       {base}/api/docs/")
        self.stdout.write(f"  demo runs: reader {reader.id}\n             release-bot {release.id}")
        self.stdout.write(f"  CLI:       .venv/bin/python manage.py show_run {release.id} --events")
        self.stdout.write("Ctrl-C (or SIGTERM, SIGHUP) stops web, worker and maintenance.\n")
