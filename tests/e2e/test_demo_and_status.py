"""Real processes (issue 38 item 7): `make run`'s demo stops at once, saying
how to pick another port, when its port is taken."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT, free_port

pytestmark = [pytest.mark.e2e]


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
