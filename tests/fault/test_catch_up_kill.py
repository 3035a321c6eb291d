"""Issue 11 item 9 with real processes: a `qcluster` worker is SIGKILLed
after a side effect's watermark, the run's newest checkpoint having been
deleted meanwhile; a real `run_maintenance` resumes it from the older
checkpoint, which is caught up from the log. Approved, the run reaches the
undisturbed end with one send and no second model call for a recorded step."""

from __future__ import annotations

import os
import signal

import pytest

from approvals.models import Approval
from approvals.services import approval_decide
from checkpoints.models import Checkpoint
from runs.models import Event, ModelCall, Run, ToolInvocation
from tests.conftest import wait_for
from tests.fault.test_kill_points import post_agent, stack, status  # noqa: F401  (the stack fixture)

pytestmark = [pytest.mark.fault, pytest.mark.django_db(transaction=True)]


def test_sigkill_with_the_newest_checkpoint_deleted_resumes_from_the_log_and_sends_once(
    stack, load_agent, submit, sink, tmp_path, operator
):  # noqa: F811
    post_agent(load_agent, sink, before=3)
    c = stack("tool.after_watermark=pause")
    run = submit()
    paused = tmp_path / f"tool.after_watermark.{run.id}.paused"
    wait_for(paused.exists, timeout=90, message=f"the worker to pause after the watermark\n{c.output()[-2000:]}")
    newest = Checkpoint.objects.filter(run=run).order_by("-version").first()
    assert newest.trigger == "model_response" and newest.state["step"] == 4
    newest.delete()
    worker = int((tmp_path / f"tool.after_watermark.{run.id}").read_text())
    os.kill(worker, signal.SIGKILL)
    wait_for(
        lambda: status(run) in ("WAITING_FOR_APPROVAL", "FAILED"),
        timeout=90,
        message="the reclaim sweep to resume the run",
    )
    row = Run.objects.get(id=run.id)
    assert row.status == "WAITING_FOR_APPROVAL", row.failure
    assert sink.count() == 0
    approval = Approval.objects.get(run=run, status="pending")
    assert approval.kind == "interrupted_side_effect"
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash, via="api")
    wait_for(lambda: status(run) in ("COMPLETED", "FAILED"), timeout=60, message="the run to end after approval")
    row = Run.objects.get(id=run.id)
    assert (row.status, row.final_message, row.step_count) == ("COMPLETED", "paid", 5), row.failure
    inv = ToolInvocation.objects.get(run=run, tool_name="http_post")
    assert sink.count() == 1 and sink.sends[0]["key"] == inv.idempotency_key
    completed = list(ModelCall.objects.filter(run=run, status="completed").values_list("step_number", flat=True))
    assert sorted(completed) == [1, 2, 3, 4, 5]
    assert Event.objects.filter(run=run, type="model.response.completed").count() == 5
