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


def test_embedded_sqlite_default_holds_a_tenant_to_its_share(tmp_path):
    """Fair workers on SQLite (issue 34 item 5): three runs of one tenant on
    two workers at a share of one lease run one at a time, and each run a
    claim left queued is claimed when the run before it ends (its release
    rings the doorbell; no maintenance runs here)."""
    from tests.conftest import wait_for

    env = _env(tmp_path)
    env.update(AGENTRT_WORKERS="2", AGENTRT_TENANT_MAX_RUNNING="1")
    assert manage(env, "migrate", "-v0").returncode == 0
    assert (
        manage(env, "create_tenant", "demo", "--user", "operator", "--password", "smoke-Operator-pass-7").returncode
        == 0
    )
    agent = tmp_path / "agent.json"
    # Long enough that the second worker meets each doorbell while the tenant's one lease is held.
    agent.write_text(
        json.dumps({"name": "slow", "model": {"provider": "scripted", "turns": [{"text": "ok", "delay_ms": 400}]}})
    )
    assert manage(env, "load_agent", str(agent)).returncode == 0
    runs = []
    for i in range(3):
        submitted = manage(env, "submit_run", "--agent", "slow", "--input", f"run {i}")
        assert submitted.returncode == 0, submitted.stderr
        runs.append(submitted.stdout.strip().splitlines()[-1].replace("-", ""))
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "qcluster"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def statuses() -> list[str]:
        with sqlite3.connect(tmp_path / "db.sqlite3") as db:
            return [row[0] for row in db.execute("SELECT status FROM runs WHERE id IN (?, ?, ?)", runs)]

    try:
        wait_for(lambda: statuses() == ["COMPLETED"] * 3, timeout=90, message="the three runs to complete")
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
    with sqlite3.connect(tmp_path / "db.sqlite3") as db:
        rows = db.execute(
            "SELECT run_id, type, occurred_at FROM events WHERE type IN ('run.claimed', 'run.completed')"
            " ORDER BY occurred_at"
        ).fetchall()
    held = most = 0
    for _, kind, _ in rows:  # a release's event is stamped before its commit, the next claim's after it
        held += 1 if kind == "run.claimed" else -1
        most = max(most, held)
    assert [kind for _, kind, _ in rows].count("run.claimed") == 3 and most == 1, rows
