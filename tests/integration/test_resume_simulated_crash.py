"""Resume and reconciliation (seed 000), driven in-process: a worker "dies"
at a fault point (a BaseException nothing in the runtime catches), its lease
is made to expire, and Resume takes over.

These are SIMULATED crashes (fast, but `finally` blocks and context managers
of the "dead" worker still run, which a SIGKILL never allows): every fault
point used here is also exercised with a real SIGKILL of a real worker in
tests/fault/test_kill_points.py."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from approvals.models import Approval
from approvals.services import approval_decide
from checkpoints.models import Checkpoint
from runs.models import Event, ModelCall, Run, ToolInvocation
from runs.runtime.executor import execute_run, run_drive
from runs.runtime.queue import run_claim
from runs.runtime.resume import RunLeased, RunNotRunning, run_resume, take_over
from runs.services.lifecycle import run_cancel
from tests.crash import Crash, crash_at, die_at, expire

pytestmark = pytest.mark.django_db(transaction=True)


def post_agent(load_agent, sink, before=0, **kw):
    turns = [{"tool_calls": [{"name": "echo", "arguments": {"text": f"look {i}"}}]} for i in range(before)]
    turns += [
        {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": 5}}}]},
        {"text": "paid"},
    ]
    return load_agent(turns=turns, tools=("echo", "http_post"), **kw)


def reload(run):
    return Run.objects.get(id=run.id)


def types(run):
    return list(Event.objects.filter(run=run).order_by("sequence").values_list("type", flat=True))


def test_interrupted_side_effect_pauses_for_an_operator_and_approval_runs_it_once_more(
    monkeypatch, load_agent, submit, sink, operator
):
    post_agent(load_agent, sink)
    run = submit()
    die_at(monkeypatch, run, "tool.after_watermark")
    assert sink.count() == 0
    assert run_resume(run_id=run.id, via="test") == "waiting"
    row = reload(run)
    assert row.status == "WAITING_FOR_APPROVAL" and row.lease_owner is None and row.lease_expires_at is None
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "interrupted" and inv.effect_sent_at is not None and inv.result is None
    approval = Approval.objects.get(run=run)
    assert approval.kind == "interrupted_side_effect" and approval.status == "pending"
    assert approval.presentation["tool"] == "http_post"
    assert approval.presentation["arguments"] == {"url": sink.url, "json": {"amount": 5}}
    assert approval.presentation["side_effect"] == "external_write"
    assert "unknown" in approval.presentation["notice"] and "runs it again" in approval.presentation["notice"]
    taken = Event.objects.get(run=run, type="lease.taken_over")
    assert taken.payload["previous_owner"] == "dying-worker"
    assert Event.objects.filter(run=run, type="step.interrupted", payload__outcome="unknown").count() == 1
    assert types(run)[-1] == "run.waiting_for_approval"
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash, via="api")
    assert reload(run).status == "QUEUED"
    run_drive(run_id=run.id)
    row = reload(run)
    assert row.status == "COMPLETED" and row.final_message == "paid"
    inv.refresh_from_db()
    assert inv.status == "completed" and inv.attempt == 2
    assert sink.count() == 1 and sink.sends[0]["key"] == inv.idempotency_key and sink.sends[0]["attempt"] == "2"
    assert Event.objects.filter(run=run, type="tool.call.proposed").count() == 1  # no second proposal
    assert Event.objects.filter(run=run, type="tool.call.started").count() == 2  # a new watermark


def test_rejecting_an_interrupted_side_effect_fails_the_run_without_calling_the_tool(
    monkeypatch, load_agent, submit, sink, operator
):
    post_agent(load_agent, sink)
    run = submit()
    die_at(monkeypatch, run, "tool.after_execute")
    assert sink.count() == 1  # it did happen; nobody knows
    assert run_resume(run_id=run.id) == "waiting"
    approval = Approval.objects.get(run=run)
    approval_decide(
        user=operator,
        approval_id=approval.id,
        approve=False,
        request_hash=approval.request_hash,
        reason="already paid",
        via="admin",
    )
    row = reload(run)
    assert row.status == "FAILED" and row.failure["reason"] == "operator_rejected"
    assert run_drive(run_id=run.id) is None
    assert sink.count() == 1
    resolved = Event.objects.get(run=run, type="approval.resolved")
    assert resolved.payload["decision"] == "rejected" and resolved.payload["decided_via"] == "admin"
    assert resolved.payload["reason"] == "already paid" and resolved.payload["decided_by"] == "op"


def test_cancelling_a_parked_run_keeps_the_invocation_interrupted_and_unknown(
    monkeypatch, load_agent, submit, sink, operator
):
    """A cancel does not close an unknown outcome's question (DESIGN §18): the
    run keeps waiting with its approval pending, approve (a re-send) is
    refused, and the decision ends it CANCELLED, the outcome still unknown."""
    from approvals.errors import RunCancelRequested

    post_agent(load_agent, sink)
    run = submit()
    die_at(monkeypatch, run, "tool.after_watermark")
    run_resume(run_id=run.id)
    assert run_cancel(run=reload(run)) == "WAITING_FOR_APPROVAL"
    assert run_cancel(run=reload(run)) == "WAITING_FOR_APPROVAL"  # a second cancel is the same request
    assert reload(run).status == "WAITING_FOR_APPROVAL" and reload(run).cancel_requested_at is not None
    approval = Approval.objects.get(run=run)
    assert approval.status == "pending"
    with pytest.raises(RunCancelRequested):
        approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash)
    assert Approval.objects.get(id=approval.id).status == "pending"
    approval_decide(user=operator, approval_id=approval.id, approve=False, request_hash=approval.request_hash)
    assert reload(run).status == "CANCELLED"
    assert Approval.objects.get(id=approval.id).status == "rejected"
    cancelled = Event.objects.get(run=run, type="run.cancelled").payload
    assert cancelled["after_decision"]["decision"] == "rejected"
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "interrupted" and inv.effect_sent_at is not None and inv.error["outcome"] == "unknown"
    assert inv.outcome == "uncertain" and inv.attempts[-1]["decision"] == "rejected"
    assert sink.count() == 0


def test_a_decision_needs_the_hash_that_was_shown_and_happens_once(monkeypatch, load_agent, submit, sink, operator):
    from approvals.errors import ApprovalDecided, ApprovalForbidden, ApprovalStale
    from runs.services import tenant_create

    post_agent(load_agent, sink)
    run = submit()
    die_at(monkeypatch, run, "tool.after_watermark")
    run_resume(run_id=run.id)
    approval = Approval.objects.get(run=run)
    with pytest.raises(ApprovalStale):
        approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash="0" * 64)
    assert Approval.objects.get(id=approval.id).status == "pending"
    _, staff = tenant_create(name="acme", username="viewer")
    with pytest.raises(ApprovalForbidden):
        approval_decide(user=staff, approval_id=approval.id, approve=True, request_hash=approval.request_hash)
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash)
    with pytest.raises(ApprovalDecided):
        approval_decide(user=operator, approval_id=approval.id, approve=False, request_hash=approval.request_hash)


def test_a_kill_before_the_watermark_runs_the_call_exactly_once(monkeypatch, load_agent, submit, sink):
    post_agent(load_agent, sink)
    run = submit()
    die_at(monkeypatch, run, "tool.before_watermark")
    assert run_resume(run_id=run.id) == "continue"
    assert reload(run).status == "QUEUED"
    run_drive(run_id=run.id)
    assert reload(run).status == "COMPLETED"
    assert sink.count() == 1


def test_a_kill_while_deciding_retries_the_step_as_its_next_attempt(monkeypatch, load_agent, submit, sink):
    post_agent(load_agent, sink)
    run = submit()
    die_at(monkeypatch, run, "model.after_call")
    assert run_resume(run_id=run.id) == "continue"
    run_drive(run_id=run.id)
    assert reload(run).status == "COMPLETED"
    attempts = list(
        ModelCall.objects.filter(run=run, step_number=1)
        .order_by("attempt_number")
        .values_list("attempt_number", "status")
    )
    assert attempts == [(1, "interrupted"), (2, "completed")]
    assert sink.count() == 1
    assert "run.resumed" in types(run)


def test_an_interrupted_read_only_call_becomes_an_observation_the_model_sees(monkeypatch, load_agent, submit):
    load_agent(turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]}, {"text": "done"}])
    run = submit()
    die_at(monkeypatch, run, "checkpoint.before_write")
    assert run_resume(run_id=run.id) == "continue"
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "interrupted" and inv.result["error"] == "interrupted"
    run_drive(run_id=run.id)
    assert reload(run).status == "COMPLETED"
    from checkpoints.repository import checkpoint_latest

    tool = [m for m in checkpoint_latest(run.id).conversation if m["role"] == "tool"]
    assert len(tool) == 1 and tool[0]["is_error"] and "interrupted" in tool[0]["content"]


def test_resume_respects_a_live_lease_and_refuses_runs_that_are_not_running(load_agent, submit):
    load_agent()
    run = submit()
    with pytest.raises(RunNotRunning):
        run_resume(run_id=run.id)  # QUEUED
    claim = run_claim(run_id=run.id, owner="alive")
    before = Run.objects.filter(id=run.id).values().get()
    with pytest.raises(RunLeased):
        run_resume(run_id=run.id)
    assert Run.objects.filter(id=run.id).values().get() == before
    execute_run(claim)
    with pytest.raises(RunNotRunning):
        run_resume(run_id=run.id)  # COMPLETED
    from runs.errors import RunNotFound

    with pytest.raises(RunNotFound):
        run_resume(run_id="00000000-0000-0000-0000-000000000000")
    with pytest.raises(RunNotFound):
        run_resume(run_id="not-a-uuid")


def test_a_resume_that_crashed_after_marking_leaves_the_unknown_outcome_for_the_next(
    monkeypatch, load_agent, submit, sink
):
    post_agent(load_agent, sink)
    run = submit()
    die_at(monkeypatch, run, "tool.after_watermark")
    undo = crash_at(monkeypatch, "resume.after_takeover")
    with pytest.raises(Crash):
        run_resume(run_id=run.id)
    undo()
    assert ToolInvocation.objects.get(run=run).status == "interrupted"
    expire(run)
    assert run_resume(run_id=run.id) == "waiting"
    assert Approval.objects.get(run=run).kind == "interrupted_side_effect"
    assert Event.objects.filter(run=run, type="lease.taken_over").count() == 2


def test_deleting_every_checkpoint_then_resuming_reaches_the_same_end(monkeypatch, load_agent, submit, sink, operator):
    post_agent(load_agent, sink, before=3)
    control = submit(text="same")
    run_drive(run_id=control.id)
    control = reload(control)
    run = submit(text="same")
    die_at(monkeypatch, run, "tool.after_watermark")
    Checkpoint.objects.filter(run=run).delete()
    assert run_resume(run_id=run.id) == "waiting"
    approval = Approval.objects.get(run=run)
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash)
    run_drive(run_id=run.id)
    row = reload(run)
    assert (row.status, row.final_message, row.step_count) == (
        control.status,
        control.final_message,
        control.step_count,
    )
    assert row.usage["tool_calls"] == control.usage["tool_calls"]

    def results(r):
        return list(ToolInvocation.objects.filter(run=r).order_by("step_number").values_list("tool_name", "status"))

    assert results(row) == results(control)


def test_a_damaged_record_fails_the_run_without_rewriting_it(monkeypatch, load_agent, submit):
    load_agent(turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]}, {"text": "done"}])
    run = submit()
    die_at(monkeypatch, run, "model.after_call")
    with connection.cursor() as cur:
        cur.execute("""UPDATE runs SET limits = '{"max_steps": "lots"}' WHERE id = %s""", [run.id])
    assert run_resume(run_id=run.id) == "failed"
    row = reload(run)
    assert row.failure["reason"] == "internal_error" and row.limits == {"max_steps": "lots"}


def test_a_run_that_keeps_losing_its_worker_fails_max_attempts_exceeded(monkeypatch, load_agent, submit):
    load_agent(turns=[{"text": "x"}])
    run = submit()
    die_at(monkeypatch, run, "model.after_call")
    Run.objects.filter(id=run.id).update(lease_expirations=3)
    assert run_resume(run_id=run.id) == "failed"
    assert reload(run).failure["reason"] == "max_attempts_exceeded"


def test_a_run_past_its_attempts_limit_with_a_side_effect_in_flight_parks_it_before_failing(
    monkeypatch, load_agent, submit, sink, operator
):
    """Found by the chaos soak: the fourth lost lease landed between a watermark and its result, and the
    takeover failed the run max_attempts_exceeded — nobody was ever asked whether the effect happened."""
    post_agent(load_agent, sink)
    run = submit()
    die_at(monkeypatch, run, "tool.after_watermark")
    Run.objects.filter(id=run.id).update(lease_expirations=3)
    assert run_resume(run_id=run.id, via="test") == "waiting"
    approval = Approval.objects.get(run=run)
    assert approval.kind == "interrupted_side_effect" and approval.status == "pending"
    assert reload(run).status == "WAITING_FOR_APPROVAL"
    approval_decide(user=operator, approval_id=approval.id, approve=False, request_hash=approval.request_hash)
    assert reload(run).failure["reason"] == "operator_rejected" and sink.count() == 0


def test_two_resumes_racing_on_separate_connections_have_exactly_one_winner(load_agent, submit):
    load_agent()
    run = submit()
    run_claim(run_id=run.id, owner="dead")
    iterations = 1000
    wins = []
    for i in range(iterations):
        expire(run)
        epoch = Run.objects.filter(id=run.id).values_list("lease_epoch", flat=True).get()
        barrier = threading.Barrier(2)
        got = []

        def race(name, barrier, got, epoch):
            barrier.wait()
            try:
                got.append(take_over(run_id=run.id, owner=name, seen_epoch=epoch, via="race"))
            finally:
                connections["default"].close()

        threads = [threading.Thread(target=race, args=(f"r{i}-{k}", barrier, got, epoch)) for k in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        wins.append(sum(1 for g in got if g is not None))
    assert wins == [1] * iterations
    assert reload(run).lease_epoch == 1 + iterations


def test_a_sweep_racing_a_completion_leaves_the_run_completed(settings, tmp_path, load_agent, submit):
    from maintenance.sweeps.reclaim import sweep_reclaim

    settings.AGENTRT_ENABLE_FAULTPOINTS = True
    settings.AGENTRT_FAULTPOINTS = "sweep.after_select=pause"
    settings.AGENTRT_FAULTPOINT_DIR = str(tmp_path)
    load_agent(turns=[{"text": "finished"}])
    run = submit()
    claim = run_claim(run_id=run.id, owner="slow-heartbeat")
    expire(run)  # the sweep will see an expired lease
    result = {}
    sweeper = threading.Thread(target=lambda: (result.update(sweep_reclaim()), connections["default"].close()))
    sweeper.start()
    from tests.conftest import wait_for

    wait_for(lambda: (tmp_path / f"sweep.after_select.{run.id}.paused").exists(), message="the sweep to select the run")
    execute_run(claim)  # the owner was alive after all and completes
    assert reload(run).status == "COMPLETED"
    (tmp_path / f"sweep.after_select.{run.id}.go").touch()
    sweeper.join()
    row = reload(run)
    assert row.status == "COMPLETED" and row.lease_epoch == 1
    assert result["expired"] == 1 and result["resumed"] == 0
    assert "lease.taken_over" not in types(run)


def test_cancelling_right_after_approving_a_rerun_keeps_the_outcome_unknown(
    monkeypatch, load_agent, submit, sink, operator
):
    post_agent(load_agent, sink)
    run = submit()
    die_at(monkeypatch, run, "tool.after_watermark")
    run_resume(run_id=run.id)
    approval = Approval.objects.get(run=run)
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash)
    assert run_cancel(run=reload(run)) == "CANCELLED"
    inv = ToolInvocation.objects.get(run=run)
    # Never a cancelled run with a watermarked call and neither result nor "unknown" (I6).
    assert inv.status == "interrupted" and inv.error["outcome"] == "unknown" and inv.effect_sent_at is not None
    assert sink.count() == 0
