"""Issue 14, item 6, in CI: a rolling deploy under load loses no run and sends
nothing twice. The real command (`bench/rolling_deploy.py`) with 30 runs:
`manage.py cluster` with two worker nodes, two web nodes and maintenance
(real qcluster, daphne, run_maintenance), runs submitted over REST while
each node is sent SIGTERM, drains and is restarted in turn. Besides the
command's own verdict, the test reads its artifacts — what the client got,
the database and the effect sink's log — and checks them itself. No timing
is asserted: the command reports drain times and submit latency."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.conftest import ROOT

RUNS = 30

pytestmark = [pytest.mark.e2e]


def rolling_database_url() -> str:
    parts = urlsplit(os.environ["DATABASE_URL"])
    name = parts.path.lstrip("/") or "agentrt"
    return urlunsplit(parts._replace(path=f"/{name}_rolling_ci"))


@pytest.fixture
def rolling_database():
    """The deploy's own database (bench/rolling_deploy.py creates it), dropped afterwards."""
    url = rolling_database_url()
    yield url
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(urlunsplit(urlsplit(url)._replace(path="/postgres")), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.timeout(540)
def test_a_rolling_deploy_under_load_loses_no_run_and_sends_nothing_twice(tmp_path, rolling_database):
    out = tmp_path / "rolling"
    cmd = [
        sys.executable,
        "bench/rolling_deploy.py",
        "--runs",
        str(RUNS),
        "--worker-nodes",
        "2",
        "--rate",
        "3",
        "--pause",
        "0.5",
        "--database-url",
        rolling_database,
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=520)
    tail = f"\n--- stdout ---\n{proc.stdout[-5000:]}\n--- stderr ---\n{proc.stderr[-5000:]}"
    assert (out / "report.json").exists(), f"no report (exit {proc.returncode}){tail}"
    report = json.loads((out / "report.json").read_text())
    assert report["violations"] == [] and report["problems"] == [], (
        json.dumps(report["violations"][:10] + report["problems"]) + tail
    )
    assert proc.returncode == 0, tail

    # every node was rolled: SIGTERM, gone, a new process ready
    rolled = {s["node"]: s for s in report["roll"]}
    assert sorted(rolled) == ["web-1", "web-2", "worker-1", "worker-2"], rolled
    assert all(s["new_pid"] != s["old_pid"] for s in rolled.values()), rolled
    # under load: the worker nodes held runs when they were told to stop (the drain had work)
    assert sum(rolled[w]["held_at_sigterm"] for w in ("worker-1", "worker-2")) >= 1, rolled

    # the client: one run per Idempotency-Key, each key answered
    submits = json.loads((out / "submits.json").read_text())
    assert len(submits) == RUNS and all(s["run"] for s in submits), [s for s in submits if not s["run"]]
    client_runs = {s["run"] for s in submits}
    assert len(client_runs) == RUNS

    # the database: exactly those runs, every one COMPLETED
    snapshot = json.loads((out / "snapshot.json").read_text())
    assert {r["id"] for r in snapshot["runs"]} == client_runs
    assert Counter(r["status"] for r in snapshot["runs"]) == {"COMPLETED": RUNS}
    # drained, not abandoned: no run waited out its lease to be taken over
    assert [e for e in snapshot["events"] if e["type"] == "lease.taken_over"] == []

    # the sink: each side-effect invocation delivered exactly once, two per run, none unaccounted for
    sink = [json.loads(line) for line in (out / "sink.jsonl").read_text().splitlines() if line.strip()]
    sends = Counter(s["key"] for s in sink)
    assert sends and max(sends.values()) == 1, [k for k, n in sends.items() if n > 1]
    effects = {i["idempotency_key"]: i["run_id"] for i in snapshot["invocations"] if not i["read_only"]}
    assert set(sends) == set(effects)
    assert Counter(effects[k] for k in sends) == {r: 2 for r in client_runs}
