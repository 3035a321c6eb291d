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
    for name in (f"gauge_liveall_{dead.pid}.db", f"histogram_{dead.pid}.db", f"counter_{dead.pid}.db",
                 f"gauge_liveall_{live}.db", f"histogram_{live}.db"):
        (tmp_path / name).write_bytes(b"")
    assert reap_once(str(tmp_path), me=1) == [dead.pid]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"histogram_{dead.pid}.db", f"counter_{dead.pid}.db", f"gauge_liveall_{live}.db", f"histogram_{live}.db"])
