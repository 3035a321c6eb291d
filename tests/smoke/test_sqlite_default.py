"""The named smoke test of the embedded default: SQLite (WAL), ORM broker,
a real qcluster, no DATABASE_URL. The rest of the suite runs on PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys

from tests.conftest import ROOT


def _env(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(AGENTRT_SQLITE_PATH=str(tmp_path / "db.sqlite3"), AGENTRT_LEASE_SECONDS="5", PYTHONUNBUFFERED="1")
    return env


def manage(env, *args, timeout=120):
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_embedded_sqlite_default_runs_an_agent_end_to_end(tmp_path):
    env = _env(tmp_path)
    assert manage(env, "migrate", "-v0").returncode == 0
    assert (
        manage(env, "create_tenant", "demo", "--user", "operator", "--password", "smoke-Operator-pass-7").returncode
        == 0
    )
    agent = tmp_path / "agent.json"
    agent.write_text(
        json.dumps(
            {
                "name": "smoke",
                "model": {
                    "provider": "scripted",
                    "turns": [
                        {"tool_calls": [{"name": "echo", "arguments": {"text": "one"}}]},
                        {"tool_calls": [{"name": "echo", "arguments": {"text": "two"}}]},
                        {"text": "smoke ok"},
                    ],
                },
                "tools": ["echo"],
            }
        )
    )
    loaded = manage(env, "load_agent", str(agent))
    assert loaded.returncode == 0, loaded.stderr
    version = loaded.stdout.strip().splitlines()[-1]
    assert len(version) == 64
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "qcluster"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        done = manage(env, "submit_run", "--agent", "smoke", "--input", "go", "--wait", "--timeout", "60")
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
    assert done.returncode == 0, done.stderr
    run_id, status = done.stdout.split()
    assert status == "COMPLETED"
    shown = json.loads(manage(env, "show_run", run_id, "--events").stdout)
    assert shown["final_message"] == "smoke ok" and shown["step_count"] == 3
    seqs = [e["sequence"] for e in shown["events"]]
    assert seqs == sorted(seqs) and len(seqs) == len(set(seqs))
    with sqlite3.connect(tmp_path / "db.sqlite3") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
