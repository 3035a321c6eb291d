"""`manage.py cluster` (what `make cluster` runs), with real processes: it
starts every node and supervises them as one unit — a node that exits is
started again, a node that cannot start stops the cluster with exit 1, and a
stop signal stops every process it started (issue 14, item 6)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT, free_port, subprocess_env, wait_for
from tests.procfs import in_sessions

pytestmark = [pytest.mark.e2e]


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class ClusterCommand:
    def __init__(self, tmp_path, *args: str, env: dict | None = None):
        self.state = tmp_path / "state.json"
        self.log_path = tmp_path / "cluster.log"
        self.log = open(self.log_path, "wb")
        argv = [
            sys.executable,
            "manage.py",
            "cluster",
            "--log-dir",
            str(tmp_path / "nodes"),
            "--state-file",
            str(self.state),
            *args,
        ]
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env or subprocess_env(),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def nodes(self) -> dict:
        try:
            return {n["name"]: n for n in json.loads(self.state.read_text())["nodes"]}
        except (OSError, ValueError):
            return {}

    def sessions(self) -> set[int]:
        return {n["pid"] for n in self.nodes().values() if n["pid"]}

    def close(self) -> None:
        sessions = self.sessions()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for sid in sessions:
            try:
                os.killpg(sid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.close()


def test_the_cluster_refuses_sqlite(tmp_path):
    env = {k: v for k, v in subprocess_env().items() if k != "DATABASE_URL"}
    env["AGENTRT_SQLITE_PATH"] = str(tmp_path / "x.sqlite3")
    proc = subprocess.run(
        [sys.executable, "manage.py", "cluster"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert "the cluster runs on PostgreSQL: set DATABASE_URL" in proc.stderr


def test_a_node_that_cannot_start_stops_the_cluster_with_exit_1(transactional_db, tmp_path):
    port = free_port()
    with socket.socket() as taken:  # the web node's port is held by someone else
        taken.bind(("127.0.0.1", port))
        taken.listen()
        c = ClusterCommand(tmp_path, "--workers", "1", "--web", "1", "--port", str(port))
        try:
            rc = c.proc.wait(timeout=180)
            out = c.output()
            assert rc == 1, out
            assert "web-1 could not start" in out, out
            assert "stopped: web-1" in out, out
            assert not in_sessions(c.sessions()), "the nodes that did start were stopped"
        finally:
            c.close()


@pytest.mark.timeout(420)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_the_cluster_restarts_a_node_that_dies_and_a_signal_stops_every_node(sig, transactional_db, tmp_path):
    port = free_port(2)
    c = ClusterCommand(tmp_path, "--workers", "2", "--web", "2", "--port", str(port), "--restart-delay", "0.2")
    try:
        wait_for(
            lambda: "agentrt cluster is running" in c.output() or c.proc.poll() is not None,
            timeout=240,
            message="every node to be ready",
        )
        assert c.proc.poll() is None, c.output()
        nodes = c.nodes()
        assert sorted(nodes) == ["maintenance", "web-1", "web-2", "worker-1", "worker-2"]
        assert {n["port"] for n in nodes.values() if n["role"] == "web"} == {port, port + 1}
        assert listening(port) and listening(port + 1)
        first = {name: n["pid"] for name, n in nodes.items()}

        # a node killed outright is started again (Restart=always) and becomes ready
        for name in ("worker-1", "web-2"):
            os.kill(first[name], signal.SIGKILL)
        wait_for(
            lambda: all(c.nodes()[n]["pid"] != first[n] and c.nodes()[n]["ready_at"] for n in ("worker-1", "web-2")),
            timeout=180,
            message="the killed nodes to be restarted and ready",
        )
        after = c.nodes()
        assert after["worker-1"]["restarts"] == 1 and after["web-2"]["restarts"] == 1
        assert after["worker-1"]["last_exit"] == -signal.SIGKILL
        assert {after[n]["pid"] for n in ("worker-2", "web-1", "maintenance")} == {
            first[n] for n in ("worker-2", "web-1", "maintenance")
        }
        assert c.proc.poll() is None
        wait_for(lambda: listening(port + 1), timeout=60, message="the restarted web node to listen")

        every = set(first.values()) | c.sessions()
        c.proc.send_signal(sig)  # to the supervisor only, as systemd / a closing terminal's supervisor would
        rc = c.proc.wait(timeout=180)
        out = c.output()
        assert rc == 0, out
        assert f"{sig.name}: stopping 5 nodes" in out
        stopped = out.rsplit("stopped: ", 1)[1].split("\n", 1)[0]
        # each main process stopped on its SIGTERM: worker nodes drained (exit 0); maintenance exits 0,
        # or -15 if the signal came before it had set up its handler
        assert stopped.startswith("web-1 0, web-2 0, worker-1 0, worker-2 0, maintenance "), out
        assert stopped.rsplit(" ", 1)[1] in ("0", "-15"), out
        wait_for(lambda: not in_sessions(every), timeout=30, message="every process the cluster started to be gone")
        assert not listening(port) and not listening(port + 1)
    finally:
        c.close()


@pytest.mark.timeout(420)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: f"{s.name}-to-make")
def test_a_signal_to_make_cluster_stops_every_node_and_the_run_in_progress_is_yielded(
    sig, transactional_db, tmp_path, load_agent, submit
):
    """`make cluster` signalled at the make process alone (as docker stop or
    systemd would): every node stops, nothing survives, the ports are free,
    and the run a worker was executing is handed back to the queue (drain),
    not lost."""
    from ops.supervise import STOP_GRACE_SECONDS, descendants
    from runs.models import Event, Run
    from tests.procfs import stat

    load_agent(
        turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": str(i)}}], "delay_ms": 300} for i in range(60)]
        + [{"text": "end"}],
        limits={"max_steps": 70, "max_model_calls": 70},
    )
    port = free_port(2)
    env = subprocess_env(WEB_PORT=port, WORKERS=1, REDIS_URL=os.environ.get("REDIS_URL", ""))
    for k in ("MAKEFLAGS", "MFLAGS"):
        env.pop(k, None)
    env["CLUSTER_ARGS"] = f"--web 1 --log-dir {tmp_path / 'nodes'} --state-file {tmp_path / 'state.json'}"
    log_path = tmp_path / "make-cluster.log"
    with open(log_path, "wb") as log:
        make = subprocess.Popen(
            ["make", "--no-print-directory", "-o", ".venv/.installed", f"PY={sys.executable}", "cluster"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    out = lambda: log_path.read_text(errors="replace")  # noqa: E731
    sessions: set[int] = set()
    try:
        wait_for(
            lambda: "agentrt cluster is running" in out() or make.poll() is not None,
            timeout=240,
            message="make cluster to be ready",
        )
        assert make.poll() is None, out()
        nodes = json.loads((tmp_path / "state.json").read_text())["nodes"]
        sessions = {n["pid"] for n in nodes if n["pid"]}
        run = submit()
        wait_for(
            lambda: Event.objects.filter(run=run, type="tool.call.completed").exists(),
            timeout=60,
            message="the run to make progress",
        )
        every = set(descendants(make.pid)) | set(in_sessions(sessions))
        assert len(every) >= 1 + 3 + 3  # the supervisor; web, worker, maintenance; the worker's sentinel & co
        make.send_signal(sig)  # the make process alone
        make.wait(timeout=STOP_GRACE_SECONDS + 60)
        text = out()
        # make passes a SIGTERM on; a SIGHUP it keeps, and the supervisor reads it in make's handlers
        said = "SIGTERM: " if sig == signal.SIGTERM else "SIGHUP to make: "
        assert f"{said}stopping 3 nodes (worker nodes drain" in text, text[-3000:]
        stopped = text.rsplit("stopped: ", 1)[1].split("\n", 1)[0]
        assert stopped.startswith("web-1 0, worker-1 0, maintenance "), text[-3000:]
        wait_for(
            lambda: all((f := stat(p)) is None or f[0] == "Z" for p in every),
            timeout=STOP_GRACE_SECONDS,
            message="every process make cluster started to end",
        )
        assert not in_sessions(sessions) and not listening(port)
        # The run in progress was yielded back to the queue, its lease released: not lost, not failed.
        assert Event.objects.filter(run=run, type="run.requeued", payload__reason="drain").exists()
        row = Run.objects.get(id=run.id)
        assert row.status == "QUEUED" and row.lease_owner is None, (row.status, row.lease_owner)
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
            make.wait()
        for sid in sessions:
            try:
                os.killpg(sid, signal.SIGKILL)
            except ProcessLookupError:
                pass
