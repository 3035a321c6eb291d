"""The checkpoint prune finds runs that ended through their terminal events,
a batch at a time (maintenance/sweeps/prune.py): new endings at every sweep,
the history a new process has not examined newest first, and an ending whose
transaction commits after a later one's is not skipped."""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import connection

from checkpoints.models import Checkpoint
from maintenance.sweeps import prune
from runs.models import Event, Run
from runs.runtime.executor import run_drive
from tests.conftest import subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def new_process():
    prune.reset_marks()
    yield
    prune.reset_marks()


def finished(load_agent, submit, n=1, text="go"):
    load_agent(
        turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": str(i)}}]} for i in range(3)] + [{"text": "ok"}]
    )
    runs = []
    for i in range(n):
        run = submit(text=f"{text} {i}")
        assert run_drive(run_id=run.id).kind.value == "completed"
        runs.append(run)
    return runs


def chain(run) -> int:
    return Checkpoint.objects.filter(run_id=run.id).count()


def age_endings(runs, seconds: float) -> None:
    """Their endings happened `seconds` ago: history for a process that starts now."""
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE events SET occurred_at = occurred_at - make_interval(secs => %s)"
            " WHERE run_id = ANY(%s) AND type IN ('run.completed', 'run.failed', 'run.cancelled')",
            [seconds, [r.id for r in runs]],
        )


def test_every_new_ending_is_pruned_at_the_next_sweep(load_agent, submit):
    first = finished(load_agent, submit, n=2)
    assert all(chain(r) > 2 for r in first)
    result = prune.sweep_prune()
    assert result["runs"] == 2 and all(chain(r) == 1 for r in first)
    later = finished(load_agent, submit, n=1, text="later")
    assert prune.sweep_prune()["runs"] == 1 and chain(later[0]) == 1
    # nothing left: pruned runs are no candidates again
    assert prune.sweep_prune() == {"runs": 0, "deleted": 0, "failed": 0}


def test_a_new_process_prunes_the_history_newest_first_in_batches(load_agent, submit, monkeypatch):
    old = finished(load_agent, submit, n=5, text="old")
    age_endings(old, 3600)
    monkeypatch.setattr(prune, "SCAN_BATCH", 2)
    monkeypatch.setattr(prune, "BACKFILL_BATCHES", 1)
    seen = []
    for _ in range(3):  # one batch of two endings a sweep, newest first
        prune.sweep_prune()
        seen.append(sorted(str(r.id) for r in old if chain(r) == 1))
    assert [len(s) for s in seen] == [2, 4, 5]
    assert set(seen[0]) == {str(old[4].id), str(old[3].id)}
    new = finished(load_agent, submit, n=1, text="new")
    assert prune.sweep_prune()["runs"] == 1 and chain(new[0]) == 1


def test_an_ending_that_commits_after_a_later_one_is_still_pruned(load_agent, submit):
    """Event ids are taken at insert: an ending can commit after an ending
    with a higher id was already read. The forward mark never moves past a
    recent ending, so the next sweep still reads the late one."""
    late, early = finished(load_agent, submit, n=2)
    ended = Event.objects.get(run_id=late.id, type="run.completed")
    payload = ended.payload
    ended.delete()
    inserted, release = threading.Event(), threading.Event()

    def slow_ending():
        # another connection ends `late` again and holds its transaction open
        with psycopg.connect(subprocess_env()["DATABASE_URL"]) as c:
            c.execute(
                "INSERT INTO events (tenant_id, session_id, sequence, run_id, type, payload, lease_epoch, occurred_at)"
                " SELECT tenant_id, session_id, 1000, id, 'run.completed', %s, lease_epoch, now() FROM runs"
                " WHERE id = %s",
                [psycopg.types.json.Jsonb(payload), late.id],
            )
            inserted.set()
            release.wait(30)
            c.commit()

    writer = threading.Thread(target=slow_ending)
    writer.start()
    try:
        assert inserted.wait(10)
        # a later ending, with a higher id, commits first
        with connection.cursor() as cur:
            cur.execute(
                "INSERT INTO events (tenant_id, session_id, sequence, run_id, type, payload, lease_epoch, occurred_at)"
                " SELECT tenant_id, session_id, 1000, id, 'run.cancelled', '{}', lease_epoch, now() FROM runs"
                " WHERE id = %s",
                [early.id],
            )
        prune.sweep_prune()
        assert chain(early) == 1 and chain(late) > 1  # the late ending is not visible yet
    finally:
        release.set()
        writer.join(10)
    prune.sweep_prune()
    assert chain(late) == 1


def test_a_run_without_its_final_snapshot_keeps_its_chain(load_agent, submit):
    (run,) = finished(load_agent, submit)
    top = Checkpoint.objects.filter(run_id=run.id).order_by("-version").first()
    Checkpoint.objects.filter(id=top.id).update(full=False)
    before = chain(run)
    assert prune.sweep_prune()["deleted"] == 0
    assert chain(run) == before and Run.objects.get(id=run.id).status == "COMPLETED"


def test_a_pass_that_fails_part_way_reads_the_same_endings_again(load_agent, submit):
    """The marks move only once a pass has pruned all it found: a run whose
    delete failed is a candidate again at the next sweep, not skipped."""
    runs = finished(load_agent, submit, n=2)
    age_endings(runs, 3600)  # settled: once read, only the marks would bring them back
    with connection.cursor() as cur:
        cur.execute(
            "CREATE FUNCTION prune_test_refuse() RETURNS trigger AS $$"
            " BEGIN RAISE EXCEPTION 'refused for the test'; END $$ LANGUAGE plpgsql"
        )
        cur.execute(
            "CREATE TRIGGER prune_test_refuse BEFORE DELETE ON checkpoints FOR EACH ROW"
            f" WHEN (OLD.run_id = '{runs[0].id}') EXECUTE FUNCTION prune_test_refuse()"
        )
    try:
        first = prune.sweep_prune()  # the refused run is isolated: the other is pruned, the pass counts one failure
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TRIGGER IF EXISTS prune_test_refuse ON checkpoints")
            cur.execute("DROP FUNCTION IF EXISTS prune_test_refuse()")
    assert first["failed"] == 1 and first["runs"] == 2
    assert chain(runs[0]) > 1 and chain(runs[1]) == 1
    assert prune.sweep_prune()["failed"] == 0
    assert chain(runs[0]) == 1 and chain(runs[1]) == 1
