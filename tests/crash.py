"""SIMULATED in-process crashes for Resume tests (real SIGKILLs at the same
points: tests/fault/test_kill_points.py): a worker "dies" at a fault point (a
BaseException nothing in the runtime catches, so finalize never runs) and
its lease is then made to expire, as a SIGKILL would leave it."""

from __future__ import annotations

import pytest
from django.db import connection

from runs.runtime.executor import execute_run
from runs.runtime.queue import run_claim


class Crash(BaseException):
    """The process died here."""


def crash_at(monkeypatch, point):
    """Make `point` kill the execution; return a function that undoes it."""
    import runs.runtime.faults

    real = runs.runtime.faults.fire

    def fire(p, run_id):
        if p == point:
            raise Crash(p)
        return real(p, run_id)

    monkeypatch.setattr(runs.runtime.faults, "fire", fire)
    monkeypatch.setattr("runs.runtime.resume.fire", fire)
    return lambda: (
        monkeypatch.setattr(runs.runtime.faults, "fire", real),
        monkeypatch.setattr("runs.runtime.resume.fire", real),
    )


def expire(run):
    with connection.cursor() as cur:
        cur.execute("UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = %s", [run.id])


def die_at(monkeypatch, run, point, owner="dying-worker"):
    """Claim the run, crash at `point`, expire the lease; return the claim."""
    undo = crash_at(monkeypatch, point)
    claim = run_claim(run_id=run.id, owner=owner)
    assert claim is not None
    with pytest.raises(Crash):
        execute_run(claim)
    undo()
    expire(run)
    return claim
