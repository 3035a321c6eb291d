"""`/metrics` stays flat in the size of the history: the figures of runs that
ended are folded into `metric_totals` once, and a scrape adds them to what
the runs not folded yet contribute (ops/fleet.py, the `metrics` sweep).

The reference everywhere is `fleet_counters()` with no scope: the same
queries over the whole tables, as every scrape ran before."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from maintenance.runner import cadences
from maintenance.sweeps.metrics import sweep_metrics
from ops import fleet
from ops.models import MetricTotal, UnfoldedRun
from runs.clock import CLOCK
from runs.models import Event, Run
from tests.ops.test_fleet import append, ev

pytestmark = pytest.mark.django_db


def _end(run, status: str, steps: int, *, ago: float = 3600) -> None:
    """Move a run to `status` as its writer would (the trigger sees an UPDATE of
    the status), an hour ago unless said otherwise."""
    Run.objects.filter(id=run.id).update(
        status=status, step_count=steps, updated_at=CLOCK.now() - timedelta(seconds=ago)
    )


@pytest.fixture
def history(load_agent, submit):
    """Runs in every state, with each kind of event the counters read."""
    load_agent(name="bot")
    runs = [submit(agent="bot", text=f"run {i}") for i in range(6)]
    t0 = CLOCK.now() - timedelta(hours=2)
    done, failed, cancelled, waiting, running, quick = runs
    append(done, ev("run.requeued", reason="slice_end"))
    append(done, ev("lease.taken_over"), ev("step.interrupted", phase="executing", outcome="unknown"), epoch=2)
    _end(done, "COMPLETED", 3)
    append(
        failed,
        ev("run.waiting_for_approval", t0, kind="approval"),
        ev("run.failed", t0 + timedelta(seconds=700), reason="approval_expired"),
        ev("tool.call.failed", tool="http_post", outcome="uncertain"),
    )
    _end(failed, "FAILED", 12)
    append(cancelled, ev("context.compacted", reason="pressure"), ev("run.cancelled", by="x", direct=True))
    _end(cancelled, "CANCELLED", 1)
    append(
        waiting,
        ev("run.waiting_for_user", t0, kind="user"),
        ev("run.requeued", t0 + timedelta(seconds=7), reason="input"),
        ev("run.waiting_for_approval", t0 + timedelta(seconds=9), kind="approval"),  # still open
    )
    Run.objects.filter(id=waiting.id).update(status="WAITING_FOR_APPROVAL")
    append(running, ev("run.requeued", reason="drain"), ev("tool.call.failed", tool="http_get", outcome="uncertain"))
    Run.objects.filter(id=running.id).update(status="RUNNING")
    _end(quick, "COMPLETED", 40)
    return runs


def test_a_run_that_ends_is_noted_once_whoever_ends_it(history):
    done, failed, cancelled, waiting, running, quick = history
    assert set(UnfoldedRun.objects.values_list("run_id", flat=True)) == {done.id, failed.id, cancelled.id, quick.id}
    Run.objects.filter(id=done.id).update(status="COMPLETED")  # terminal to terminal: no second note
    Run.objects.filter(id=running.id).update(status="QUEUED")  # not an end
    assert UnfoldedRun.objects.count() == 4


def test_folding_changes_no_figure_and_the_scrape_then_skips_the_folded_runs(history):
    reference = fleet.fleet_counters()
    statuses = fleet.fleet_snapshot()["runs_by_status"]
    assert reference["run_steps"]["completed"].count == 2 and reference["leases_lost"]["side_effect"] == 1
    assert fleet.deployment_counters() == reference  # nothing folded yet

    folded = []
    while n := fleet.fold(batch=2, settled_seconds=0):
        folded.append(n)
        assert fleet.deployment_counters() == reference  # after each batch
        assert fleet.fleet_snapshot()["runs_by_status"] == statuses
    assert folded == [2, 2] and UnfoldedRun.objects.count() == 0
    assert MetricTotal.objects.filter(series="run_steps", label="completed", bucket="+Inf").get().value == 2

    # The folded runs' rows are no longer read: with them gone the scrape is
    # unchanged (the whole-table reference is not).
    ended = [history[i].id for i in (0, 1, 2, 5)]  # done, failed, cancelled, quick
    Event.objects.filter(run_id__in=ended).delete()
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM runs WHERE id = ANY(%s)", [ended])
    assert fleet.fleet_counters() != reference
    assert fleet.deployment_counters() == reference
    assert fleet.fleet_snapshot()["runs_by_status"] == statuses


def test_live_runs_are_counted_as_they_go_and_folded_once_they_end(history):
    fleet.fold(batch=100, settled_seconds=0)
    waiting = history[3]
    append(waiting, ev("run.cancelled", CLOCK.now(), by="x", direct=True))  # ends the open wait
    _end(waiting, "CANCELLED", 2, ago=5)
    after = fleet.fleet_counters()
    assert after["cancelled"]["requested"] == 2 and after["waiting"]["approval"].count == 2
    assert fleet.deployment_counters() == after
    assert fleet.fold(batch=100, settled_seconds=30) == 0  # ended seconds ago: left for a later sweep
    assert fleet.fold(batch=100, settled_seconds=0) == 1
    assert fleet.deployment_counters() == after


def test_the_maintenance_sweep_folds_the_settled_runs(history):
    assert "metrics" in [name for name, _, _ in cadences()]
    reference = fleet.fleet_counters()
    assert sweep_metrics() == {"folded_runs": 4}
    assert sweep_metrics() == {"folded_runs": 0}
    assert fleet.deployment_counters() == reference
