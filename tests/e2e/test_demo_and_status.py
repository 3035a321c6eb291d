"""Real processes (issue 38 item 7): `agentrt_status` counts the workers of a
qcluster that is up and idle (it said "0 live workers": it counted only
workers holding a lease), and `make run`'s demo stops at once, saying how
to pick another port, when its port is taken."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT, free_port, subprocess_env, wait_for

pytestmark = [pytest.mark.e2e]


def status(env) -> dict:
    done = subprocess.run(
        [sys.executable, "manage.py", "agentrt_status", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.django_db(transaction=True)
def test_agentrt_status_counts_the_idle_workers_of_a_cluster_that_is_up(cluster):
    env = subprocess_env()
    assert status(env)["live_workers"] == 0  # nothing up yet
    c = cluster(AGENTRT_WORKERS=2)
    seen = wait_for(
        lambda: (s := status(env))["live_workers"] == 2 and s,
        timeout=90,
        interval=0.5,
        message=f"two live workers\n{c.output()[-3000:]}",
    )
    assert (seen["busy_workers"], seen["leased_runs"], seen["nodes"]) == (0, 0, 1)  # up and idle
    text = subprocess.run(
        [sys.executable, "manage.py", "agentrt_status"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    ).stdout
    assert "live workers     2 on 1 node (0 busy, holding 0 leases)" in text
    c.stop()
    wait_for(lambda: status(env)["live_workers"] == 0, timeout=60, interval=0.5, message="the stopped node to go")


def test_the_demo_stops_at_once_and_says_how_to_pick_another_port_when_its_port_is_taken(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(AGENTRT_SQLITE_PATH=str(tmp_path / "demo.sqlite3"), PYTHONUNBUFFERED="1")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        done = subprocess.run(
            [sys.executable, "manage.py", "demo", "--port", str(port)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"port {port} on 127.0.0.1 is already in use" in done.stderr
    assert f"PORT={port + 1} make run" in done.stderr and f"manage.py demo --port {port + 1}" in done.stderr
    assert "agentrt is running" not in done.stdout  # nothing was started, nothing announced
    assert not (tmp_path / "demo.sqlite3").exists()  # it stopped before migrating
