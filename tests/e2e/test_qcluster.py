"""End to end through a real `qcluster` process (never django-q2's sync mode)."""

from __future__ import annotations

import itertools

import pytest

from runs.models import Event, Run
from tests.conftest import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def status(run_id):
    return Run.objects.filter(id=run_id).values_list("status", flat=True).get()


def is_completed(run_id):
    """A condition for wait_for, bound to this run (not to a loop variable)."""
    return lambda: status(run_id) == "COMPLETED"


def test_a_run_submitted_from_python_completes_on_a_real_cluster(cluster, load_agent, submit):
    from django.conf import settings

    assert settings.Q_CLUSTER.get("sync") is not True
    load_agent(turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}]}, {"text": "bye"}])
    c = cluster(AGENTRT_LEASE_SECONDS=3)
    runs = [submit(text=f"run {i}") for i in range(5)]
    for run in runs:
        wait_for(is_completed(run.id), timeout=60, message=f"run {run.id} to complete\n{c.output()}")
    for run in runs:
        row = Run.objects.get(id=run.id)
        assert row.final_message == "bye" and row.lease_owner is None
        claimed = Event.objects.get(run=run, type="run.claimed")
        assert claimed.payload["lease_epoch"] == 1
        assert row.attempts == 1


def test_the_heartbeat_renews_the_lease_while_a_long_step_runs(cluster, load_agent, submit, tmp_path):
    """A 6 s model call under a 2 s lease, with a real `run_maintenance`
    sweeping expired leases: only renewal keeps the run from being taken
    over. Without it the sweep takes the run (lease.taken_over, epoch 2) and
    the worker fences itself (run.fenced): the test fails (checked by
    disabling renewal in runs/runtime/supervisor.py)."""
    import subprocess
    import sys

    from tests.conftest import ROOT, subprocess_env

    load_agent(turns=[{"text": "slow", "delay_ms": 6000}])
    env = dict(AGENTRT_LEASE_SECONDS=2)
    c = cluster(**env)
    log = open(tmp_path / "maintenance.log", "wb")
    maintenance = subprocess.Popen(
        [sys.executable, "manage.py", "run_maintenance"],
        cwd=ROOT,
        env=subprocess_env(**env),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        run = submit()
        wait_for(lambda: status(run.id) == "RUNNING", timeout=30, message="the run to be claimed")
        seen = []  # every lease_expires_at observed while the run held its first lease

        def observe():
            row = Run.objects.filter(id=run.id).values("status", "lease_expires_at", "lease_epoch").get()
            if (
                row["status"] == "RUNNING"
                and row["lease_expires_at"]
                and (not seen or seen[-1] != row["lease_expires_at"])
            ):
                seen.append(row["lease_expires_at"])
            return row["status"] != "RUNNING"

        wait_for(observe, timeout=40, interval=0.05, message=f"the run to end\n{c.output()}")
        row = Run.objects.get(id=run.id)
        types = list(Event.objects.filter(run=run).values_list("type", flat=True))
        assert row.status == "COMPLETED", (row.status, row.failure, types)
        # The model call outlived the lease three times over; heartbeats kept it, so the sweep never took it.
        assert "lease.taken_over" not in types and "run.fenced" not in types, types
        assert row.lease_epoch == 1 and row.attempts == 1
        # ... and the lease moved forward across heartbeats, each renewal later than the one before.
        assert len(seen) >= 3, seen
        assert all(b > a for a, b in itertools.pairwise(seen)), seen
    finally:
        maintenance.terminate()
        try:
            maintenance.wait(timeout=10)
        except subprocess.TimeoutExpired:
            maintenance.kill()
        log.close()


def test_a_duplicate_doorbell_for_a_finished_run_changes_nothing(cluster, load_agent, submit):
    from runs.runtime.enqueue import enqueue_drive

    load_agent()
    cluster(AGENTRT_LEASE_SECONDS=3)
    run = submit()
    wait_for(lambda: status(run.id) == "COMPLETED", timeout=60, message="completion")
    before = (Run.objects.get(id=run.id).updated_at, Event.objects.filter(run=run).count())
    enqueue_drive(run.id)
    from django_q.models import OrmQ

    wait_for(lambda: not OrmQ.objects.exists(), timeout=30, message="the duplicate doorbell to be consumed")
    assert (Run.objects.get(id=run.id).updated_at, Event.objects.filter(run=run).count()) == before


def test_slices_yield_the_run_back_to_queued_and_it_still_completes(cluster, load_agent, submit):
    load_agent(
        turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": str(i)}}], "delay_ms": 300} for i in range(5)]
        + [{"text": "end"}]
    )
    cluster(AGENTRT_LEASE_SECONDS=3, AGENTRT_SLICE_SECONDS=0.5)
    run = submit()
    wait_for(lambda: status(run.id) == "COMPLETED", timeout=60, message="completion across slices")
    types = list(Event.objects.filter(run=run).order_by("sequence").values_list("type", flat=True))
    assert types.count("run.requeued") >= 2
    assert types.count("run.claimed") == types.count("run.requeued") + 1
    assert Run.objects.get(id=run.id).lease_epoch == types.count("run.claimed")
    # Figure for the notes (not an assertion): yield → next claim.
    import json

    from tests.conftest import ROOT

    rows = list(
        Event.objects.filter(run=run, type__in=("run.requeued", "run.claimed"))
        .order_by("sequence")
        .values_list("type", "occurred_at")
    )
    gaps = [
        (b[1] - a[1]).total_seconds() * 1000
        for a, b in itertools.pairwise(rows)
        if a[0] == "run.requeued" and b[0] == "run.claimed"
    ]
    (ROOT / "artifacts").mkdir(exist_ok=True)
    with open(ROOT / "artifacts" / "yield_to_claim_ms.json", "w") as fh:
        json.dump({"gaps_ms": [round(g, 1) for g in gaps], "poll_s": 0.02}, fh)


def test_sigterm_drains_the_cluster_and_yields_the_run_for_another_node(cluster, load_agent, submit):
    import signal

    load_agent(
        turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": str(i)}}], "delay_ms": 400} for i in range(30)]
        + [{"text": "end"}],
        limits={"max_steps": 40, "max_model_calls": 40},
    )
    first = cluster(AGENTRT_LEASE_SECONDS=30, AGENTRT_WORKERS=1)
    run = submit()
    wait_for(
        lambda: Event.objects.filter(run=run, type="tool.call.completed").exists(),
        timeout=60,
        message="the run to make progress",
    )
    first.proc.send_signal(signal.SIGTERM)
    wait_for(
        lambda: Event.objects.filter(run=run, type="run.requeued", payload__reason="drain").exists(),
        timeout=20,
        message=f"the run to be yielded on drain\n{first.output()[-2000:]}",
    )
    first.proc.wait(timeout=30)
    row = Run.objects.get(id=run.id)
    assert row.lease_owner is None and row.status in ("QUEUED", "RUNNING", "COMPLETED")
    # With a 30 s lease nothing could have taken it over: the drain handed it back.
    cluster(AGENTRT_LEASE_SECONDS=30, AGENTRT_WORKERS=1)
    wait_for(lambda: status(run.id) == "COMPLETED", timeout=60, message="another node to finish the run")
    assert not Event.objects.filter(run=run, type="lease.taken_over").exists()


def test_a_long_conversation_is_compacted_on_a_real_cluster(cluster, load_agent, submit):
    turns = [{"tool_calls": [{"name": "echo", "arguments": {"text": f"{i}:" + "x" * 400}}]} for i in range(12)] + [
        {"text": "all read"}
    ]
    load_agent(
        model={"provider": "scripted", "turns": turns, "context_window": 2000},
        limits={"max_steps": 20, "max_tool_calls": 30},
    )
    cluster(AGENTRT_LEASE_SECONDS=5)
    run = submit()
    wait_for(lambda: status(run.id) in ("COMPLETED", "FAILED"), timeout=60, message="the run to end")
    row = Run.objects.get(id=run.id)
    assert row.status == "COMPLETED" and row.final_message == "all read"
    compacted = Event.objects.filter(run=run, type="context.compacted")
    assert compacted.exists()
    from checkpoints.models import Checkpoint

    assert Checkpoint.objects.filter(run=run, trigger="compaction", full=True).count() == compacted.count()
    from runs.models import ModelCall

    hashes = list(ModelCall.objects.filter(run=run).values_list("prefix_sha256", flat=True))
    assert len(hashes) == len(set(hashes)) == 13 and all(hashes)
