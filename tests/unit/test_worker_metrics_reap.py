"""A dead worker's live-gauge files go; its histogram and counter files
stay, so a node's totals never go down when django-q2 recycles or loses a
worker."""

import os
import subprocess
import sys

from ops.worker_metrics import reap_once


def test_reap_drops_a_dead_workers_live_gauges_and_keeps_its_histograms(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = os.getpid()
    for name in (
        f"gauge_liveall_{dead.pid}.db",
        f"histogram_{dead.pid}.db",
        f"counter_{dead.pid}.db",
        f"gauge_liveall_{live}.db",
        f"histogram_{live}.db",
    ):
        (tmp_path / name).write_bytes(b"")
    assert reap_once(str(tmp_path), me=1) == [dead.pid]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"histogram_{dead.pid}.db", f"counter_{dead.pid}.db", f"gauge_liveall_{live}.db", f"histogram_{live}.db"]
    )


def test_a_worker_node_whose_metrics_port_is_taken_stops_with_the_reason(tmp_path):
    """Real `qcluster` processes: the second node on the same port exits non-zero and names the port."""
    import socket

    from tests.conftest import ROOT

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {
            **os.environ,
            "AGENTRT_METRICS_PORT": str(port),
            "DATABASE_URL": "postgres://postgres@127.0.0.1:1/none",
            "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
            "DJANGO_SECRET_KEY": "test-only-key",
        }
        done = subprocess.run(
            [sys.executable, "manage.py", "qcluster"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
    assert done.returncode != 0
    assert f"AGENTRT_METRICS_PORT 127.0.0.1:{port} cannot be served" in done.stderr
