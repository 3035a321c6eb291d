"""The embedded default stops as a whole: `manage.py demo` (what `make run`
runs) stopped with SIGTERM, SIGHUP or Ctrl-C stops the web server, the
worker (draining it) and maintenance, frees its port, and a second start
right after starts cleanly; `make run` itself, signalled as docker stop,
systemd or a closing terminal would signal it (SIGTERM or SIGHUP to the make
process alone, SIGINT to its group), leaves nothing behind. Real processes,
a scratch SQLite file, a free port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from ops.supervise import STOP_GRACE_SECONDS, descendants
from tests.conftest import ROOT, free_port, wait_for
from tests.procfs import children, comm, in_sessions, stat

pytestmark = [pytest.mark.e2e]


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Demo:
    def __init__(self, tmp_path, port: int, n: int):
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        env.update(
            AGENTRT_SQLITE_PATH=str(tmp_path / "demo.sqlite3"), PYTHONUNBUFFERED="1", AGENTRT_LOG_LEVEL="WARNING"
        )
        self.log_path = tmp_path / f"demo-{n}.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "demo", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def started(self) -> list[int] | None:
        """The demo's children once web, worker (with its workers) and maintenance are up."""
        kids = children(self.proc.pid)
        if len(kids) != 3 or "agentrt is running" not in self.output():
            return None
        roles = {comm(p) for p in in_sessions(set(kids))}
        return kids if {"qc-sentinel", "qc-worker", "qc-pusher", "qc-monitor"} <= roles else None

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()


def start_demo(tmp_path, port: int, n: int) -> tuple[Demo, list[int]]:
    demo = Demo(tmp_path, port, n)
    try:
        kids = wait_for(demo.started, timeout=120, message="the demo to start")
        wait_for(lambda: listening(port), timeout=60, message=f"the web server on port {port}")
    except AssertionError as exc:
        demo.close()
        raise AssertionError(f"{exc}\n{demo.output()[-4000:]}") from None
    return demo, kids


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_to_the_demo_stops_everything_it_started_and_it_starts_again(sig, tmp_path):
    port = free_port()
    demo, kids = start_demo(tmp_path, port, 1)
    try:
        sessions = set(kids)
        assert len(in_sessions(sessions)) >= 3 + 4  # web, qcluster, maintenance; sentinel, worker(s), pusher, monitor
        demo.proc.send_signal(
            sig
        )  # to the demo's process only, as docker stop / systemd / a closing terminal's supervisor
        rc = demo.proc.wait(timeout=120)
        out = demo.output()
        assert rc == 0, out[-3000:]
        assert f"{sig.name}: stopping web, worker and maintenance" in out
        # Each child stopped on the SIGTERM it was sent: the worker drained (its qcluster exited 0);
        # maintenance exits 0, or -15 when the signal came before it had set up its handler.
        stopped = out.rsplit("stopped: ", 1)[1].split("\n", 1)[0]
        assert stopped in ("web 0, worker 0, maintenance 0", "web 0, worker 0, maintenance -15"), out[-3000:]
        assert not in_sessions(sessions), "nothing the demo started is left running"
        assert not listening(port)
    finally:
        demo.close()
    again, kids2 = start_demo(tmp_path, port, 2)
    try:
        assert "Address already in use" not in again.output()
        assert again.proc.poll() is None and set(kids2).isdisjoint(kids)
        again.proc.send_signal(signal.SIGTERM)
        assert again.proc.wait(timeout=120) == 0
        assert not in_sessions(set(kids2))
    finally:
        again.close()


def test_a_demo_killed_outright_takes_its_children_with_it(tmp_path):
    """SIGKILL leaves the demo no chance to stop anything: the kernel tells
    each child (PR_SET_PDEATHSIG), and each stops as on SIGTERM."""
    port = free_port()
    demo, kids = start_demo(tmp_path, port, 1)
    try:
        demo.proc.send_signal(signal.SIGKILL)
        demo.proc.wait(timeout=30)
        wait_for(lambda: not in_sessions(set(kids)), timeout=90, message="the orphaned children to stop")
        wait_for(lambda: not listening(port), timeout=30, message="the port to be free")
    finally:
        demo.close()


class MakeRun(Demo):
    """`make run` itself, in a session of its own (make's pid is its group's id)."""

    def __init__(self, tmp_path, port: int):
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "MAKEFLAGS", "MFLAGS")}
        env.update(
            AGENTRT_SQLITE_PATH=str(tmp_path / "demo.sqlite3"),
            PYTHONUNBUFFERED="1",
            AGENTRT_LOG_LEVEL="WARNING",
            PORT=str(port),
        )
        self.log_path = tmp_path / "make-run.log"
        self.log = open(self.log_path, "wb")
        # -o: the venv is what it is (never reinstalled from a test); PY: this interpreter (a scratch copy has no .venv)
        self.proc = subprocess.Popen(
            ["make", "--no-print-directory", "-o", ".venv/.installed", f"PY={sys.executable}", "run"],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def supervisor(self) -> int | None:
        kids = children(self.proc.pid)
        return kids[0] if len(kids) == 1 else None

    def started(self) -> list[int] | None:
        demo = self.supervisor()
        if demo is None or comm(demo).startswith(("sh", "bash", "dash")):
            return None  # the recipe `exec`s the demo: make's one child is the demo itself
        kids = children(demo)
        if len(kids) != 3 or "agentrt is running" not in self.output():
            return None
        roles = {comm(p) for p in in_sessions(set(kids))}
        return kids if {"qc-sentinel", "qc-worker", "qc-pusher", "qc-monitor"} <= roles else None


def gone(pids: set[int]) -> bool:
    """None of `pids` runs any more (gone, or a zombie nobody has reaped yet)."""
    return all((fields := stat(p)) is None or fields[0] == "Z" for p in pids)


@pytest.mark.parametrize(
    "sig, to_group",
    [(signal.SIGTERM, False), (signal.SIGHUP, False), (signal.SIGINT, True)],
    ids=["SIGTERM-to-make", "SIGHUP-to-make", "SIGINT-to-the-group"],
)
def test_a_signal_to_make_run_stops_every_process_it_started(sig, to_group, tmp_path):
    port = free_port()
    make = MakeRun(tmp_path, port)
    try:
        kids = wait_for(make.started, timeout=180, message="make run to start")
        wait_for(lambda: listening(port), timeout=60, message=f"the web server on port {port}")
    except AssertionError as exc:
        make.close()
        raise AssertionError(f"{exc}\n{make.output()[-4000:]}") from None
    try:
        every = set(descendants(make.proc.pid)) | set(in_sessions(set(kids)))
        assert len(every) >= 1 + 3 + 4  # the demo; web, qcluster, maintenance; the qcluster's processes
        if to_group:
            os.killpg(make.proc.pid, sig)  # Ctrl-C in the terminal: the foreground group
        else:
            make.proc.send_signal(sig)  # the make process alone
        make.proc.wait(timeout=STOP_GRACE_SECONDS + 60)
        out = make.output()
        # SIGTERM: make passes it on; SIGHUP: make keeps it and the demo reads it in make's handlers;
        # SIGINT to the group: the demo's own
        said = {"SIGTERM": "SIGTERM", "SIGHUP": "SIGHUP to make", "SIGINT": "SIGINT"}[sig.name]
        assert f"{said}: stopping web, worker and maintenance (the worker yields its runs)" in out, out[-3000:]
        stopped = out.rsplit("stopped: ", 1)[1].split("\n", 1)[0]
        assert stopped.startswith("web 0, worker 0, maintenance "), out[-3000:]  # the worker drained
        wait_for(lambda: gone(every), timeout=STOP_GRACE_SECONDS, message="every process make run started to end")
        assert not in_sessions(set(kids)) and not listening(port)
    finally:
        make.close()
        for sid in kids:  # whatever a failed stop left
            try:
                os.killpg(sid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
