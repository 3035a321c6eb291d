"""End to end through a real `qcluster` process (never django-q2's sync mode)."""
from __future__ import annotations

import pytest

from runs.models import Event, Run
from tests.conftest import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def status(run_id):
    return Run.objects.filter(id=run_id).values_list("status", flat=True).get()


def test_a_run_submitted_from_python_completes_on_a_real_cluster(cluster, load_agent, submit):
    from django.conf import settings

    assert settings.Q_CLUSTER.get("sync") is not True
    load_agent(turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}]}, {"text": "bye"}])
    c = cluster(AGENTRT_LEASE_SECONDS=3)
    runs = [submit(text=f"run {i}") for i in range(5)]
    for run in runs:
        wait_for(lambda: status(run.id) == "COMPLETED", timeout=60, message=f"run {run.id} to complete\n{c.output()}")
    for run in runs:
        row = Run.objects.get(id=run.id)
        assert row.final_message == "bye" and row.lease_owner is None
        claimed = Event.objects.get(run=run, type="run.claimed")
        assert claimed.payload["lease_epoch"] == 1
        assert row.attempts == 1


def test_the_heartbeat_renews_the_lease_while_a_long_step_runs(cluster, load_agent, submit):
    load_agent(turns=[{"text": "slow", "delay_ms": 3500}])
    cluster(AGENTRT_LEASE_SECONDS=1.5)
    run = submit()
    wait_for(lambda: status(run.id) == "RUNNING", timeout=30, message="the run to be claimed")
    first = Run.objects.get(id=run.id).lease_expires_at
    wait_for(lambda: Run.objects.get(id=run.id).lease_expires_at != first or status(run.id) != "RUNNING",
             timeout=10, message="a heartbeat to extend the lease")
    wait_for(lambda: status(run.id) == "COMPLETED", timeout=30, message="the run to complete")
    row = Run.objects.get(id=run.id)
    # The model call outlived the 1.5 s lease; heartbeats kept it, so nobody fenced it.
    assert row.lease_epoch == 1
    assert not Event.objects.filter(run=run, type="run.fenced").exists()


def test_a_duplicate_doorbell_for_a_finished_run_changes_nothing(cluster, load_agent, submit):
    from runs.executor import enqueue_drive

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
    load_agent(turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": str(i)}}], "delay_ms": 300} for i in range(5)] + [{"text": "end"}])
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

    rows = list(Event.objects.filter(run=run, type__in=("run.requeued", "run.claimed")).order_by("sequence").values_list("type", "occurred_at"))
    gaps = [(b[1] - a[1]).total_seconds() * 1000 for a, b in zip(rows, rows[1:]) if a[0] == "run.requeued" and b[0] == "run.claimed"]
    (ROOT / "artifacts").mkdir(exist_ok=True)
    with open(ROOT / "artifacts" / "yield_to_claim_ms.json", "w") as fh:
        json.dump({"gaps_ms": [round(g, 1) for g in gaps], "poll_s": 0.02}, fh)


def test_sigterm_drains_the_cluster_and_yields_the_run_for_another_node(cluster, load_agent, submit):
    import signal

    load_agent(turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": str(i)}}], "delay_ms": 400} for i in range(30)] + [{"text": "end"}],
               limits={"max_steps": 40, "max_model_calls": 40})
    first = cluster(AGENTRT_LEASE_SECONDS=30, AGENTRT_WORKERS=1)
    run = submit()
    wait_for(lambda: Event.objects.filter(run=run, type="tool.call.completed").exists(), timeout=60, message="the run to make progress")
    first.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: Event.objects.filter(run=run, type="run.requeued", payload__reason="drain").exists(), timeout=20,
             message=f"the run to be yielded on drain\n{first.output()[-2000:]}")
    first.proc.wait(timeout=30)
    row = Run.objects.get(id=run.id)
    assert row.lease_owner is None and row.status in ("QUEUED", "RUNNING", "COMPLETED")
    # With a 30 s lease nothing could have taken it over: the drain handed it back.
    cluster(AGENTRT_LEASE_SECONDS=30, AGENTRT_WORKERS=1)
    wait_for(lambda: status(run.id) == "COMPLETED", timeout=60, message="another node to finish the run")
    assert not Event.objects.filter(run=run, type="lease.taken_over").exists()


def test_a_long_conversation_is_compacted_on_a_real_cluster(cluster, load_agent, submit):
    turns = [{"tool_calls": [{"name": "echo", "arguments": {"text": f"{i}:" + "x" * 400}}]} for i in range(12)] + [{"text": "all read"}]
    load_agent(model={"provider": "scripted", "turns": turns, "context_window": 2000}, limits={"max_steps": 20, "max_tool_calls": 30})
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
