"""Recovery from a checkpoint older than the log (issue 11 item 9, seed 002's
stored form, DESIGN §12): a run whose newest non-terminal checkpoint is gone
catches its state up from the event log and the invocation rows, and reaches
the same end as an undisturbed run — no second model call for a recorded
step, no duplicate idempotency key, no second effect."""

from __future__ import annotations

import pytest

import runs.runtime.faults
from approvals.models import Approval
from approvals.services import approval_decide
from checkpoints.models import Checkpoint
from runs.models import Event, ModelCall, Run, ToolInvocation
from runs.runtime.executor import execute_run, run_drive
from runs.runtime.queue import run_claim
from runs.runtime.resume import run_resume
from tests.crash import Crash, expire

pytestmark = pytest.mark.django_db(transaction=True)


def die_at_nth(monkeypatch, run, point, n):
    """Claim the run and crash at the n-th firing of `point`; expire the lease."""
    real = runs.runtime.faults.fire
    seen = {"n": 0}

    def fire(p, run_id):
        if p == point:
            seen["n"] += 1
            if seen["n"] == n:
                raise Crash(p)
        return real(p, run_id)

    monkeypatch.setattr(runs.runtime.faults, "fire", fire)
    claim = run_claim(run_id=run.id, owner="dying-worker")
    with pytest.raises(Crash):
        execute_run(claim)
    monkeypatch.setattr(runs.runtime.faults, "fire", real)
    expire(run)


def delete_newest_checkpoint(run):
    newest = Checkpoint.objects.filter(run=run).order_by("-version").first()
    assert newest.trigger not in ("final", "terminal")
    newest.delete()
    return newest


def reload(run):
    return Run.objects.get(id=run.id)


def end_state(run):
    row = reload(run)
    invocations = list(
        ToolInvocation.objects.filter(run=run)
        .order_by("step_number", "call_index")
        .values_list("step_number", "tool_name", "arguments")
    )
    return (row.status, row.final_message, row.step_count, invocations)


def one_completed_call_per_step(run):
    steps = list(ModelCall.objects.filter(run=run, status="completed").values_list("step_number", flat=True))
    responses = list(
        Event.objects.filter(run=run, type="model.response.completed").values_list("payload__step", flat=True)
    )
    return sorted(steps) == sorted(set(steps)) and sorted(responses) == sorted(set(responses))


def echo_agent(load_agent, sink=None, post=False):
    turns = [{"tool_calls": [{"name": "echo", "arguments": {"text": f"look {i}"}}]} for i in range(4)]
    tools = ["echo"]
    if post:
        turns.append({"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": 5}}}]})
        tools.append("http_post")
    turns.append({"text": "done"})
    return load_agent(turns=turns, tools=tuple(tools))


def test_a_deleted_newest_checkpoint_after_a_read_only_step_is_caught_up_from_the_log(monkeypatch, load_agent, submit):
    echo_agent(load_agent)
    control = submit(text="same")
    run_drive(run_id=control.id)
    assert reload(control).status == "COMPLETED"
    run = submit(text="same")
    # Step 3's model response and decisions are committed; the process dies before its results.
    die_at_nth(monkeypatch, run, "checkpoint.before_write", 3)
    gone = delete_newest_checkpoint(run)
    assert gone.trigger == "model_response"
    assert run_resume(run_id=run.id, via="test") == "continue"
    run_drive(run_id=run.id)
    row = reload(run)
    assert row.status == "COMPLETED", row.failure
    assert end_state(run) == end_state(control)
    assert one_completed_call_per_step(run)
    # The interrupted read-only call of step 3 was answered from its row; the model saw it.
    step3 = ToolInvocation.objects.get(run=run, step_number=3)
    assert step3.status == "interrupted" and step3.result["error"] == "interrupted"


def test_a_deleted_newest_checkpoint_before_an_interrupted_side_effect_pauses_then_completes_once(
    monkeypatch, load_agent, submit, sink, operator
):
    echo_agent(load_agent, sink, post=True)
    control = submit(text="same")
    run_drive(run_id=control.id)
    assert reload(control).status == "COMPLETED" and sink.count() == 1
    run = submit(text="same")
    die_at_nth(monkeypatch, run, "tool.after_watermark", 1)  # step 5's http_post
    gone = delete_newest_checkpoint(run)
    assert gone.trigger == "model_response"
    assert run_resume(run_id=run.id, via="test") == "waiting"
    approval = Approval.objects.get(run=run)
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash)
    run_drive(run_id=run.id)
    row = reload(run)
    assert row.status == "COMPLETED", row.failure
    assert end_state(run) == end_state(control)
    assert one_completed_call_per_step(run)
    post = ToolInvocation.objects.get(run=run, tool_name="http_post")
    assert sink.count(post.idempotency_key) == 1 and sink.count() == 2  # control's send and this run's one re-run
    assert reload(run).usage["tool_calls"] == reload(control).usage["tool_calls"]


def test_deleting_the_newest_checkpoint_after_every_step_still_reaches_the_same_end(monkeypatch, load_agent, submit):
    echo_agent(load_agent)
    control = submit(text="same")
    run_drive(run_id=control.id)
    run = submit(text="same")
    for _ in range(3):  # a fourth loss of the worker would fail max_attempts_exceeded
        die_at_nth(monkeypatch, run, "checkpoint.before_write", 1)  # each execution dies in its first batch
        delete_newest_checkpoint(run)
        assert run_resume(run_id=run.id, via="test") == "continue"
    run_drive(run_id=run.id)
    assert end_state(run) == end_state(control)
    assert one_completed_call_per_step(run)
