"""Child runs under real SIGKILLs (issue 15 §1): a real `qcluster` and a real
`run_maintenance`, fault points in `pause` mode so the test chooses which
worker dies where. A kill of the parent's worker right after its suspension
committed, or of the worker finishing the last child, loses no join and runs
no child twice."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from checkpoints.repository import checkpoint_latest
from runs.models import Event, ModelCall, Run
from tests.conftest import wait_for

pytestmark = [pytest.mark.fault, pytest.mark.django_db(transaction=True)]

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")


class Pauses:
    """The files of one fault point in `pause` mode (runs/runtime/faults.py): who paused, by which process,
    and the `go` that lets it continue."""

    def __init__(self, folder: Path, point: str):
        self.folder, self.point = folder, point

    def paused(self, run_id) -> bool:
        return (self.folder / f"{self.point}.{run_id}.paused").exists()

    def pid(self, run_id) -> int:
        return int((self.folder / f"{self.point}.{run_id}").read_text())

    def release(self, run_id) -> None:
        (self.folder / f"{self.point}.{run_id}.go").touch()

    def release_all_but(self, keep=()) -> None:
        for paused in self.folder.glob(f"{self.point}.*.paused"):
            run_id = paused.name[len(self.point) + 1 : -len(".paused")]
            if run_id not in {str(k) for k in keep}:
                self.release(run_id)


def status(run_id) -> str:
    return Run.objects.filter(id=run_id).values_list("status", flat=True).get()


@pytest.fixture
def lead(load_agent):
    load_agent(name="researcher", turns=[{"text": "the answer is 42"}])
    load_agent(name="writer", turns=[{"text": "roses are red"}])
    load_agent(
        name="lead",
        tools=("delegate_run",),
        delegates=["researcher", "writer"],
        turns=[
            {
                "tool_calls": [
                    {"name": "delegate_run", "arguments": {"agent": "researcher", "input": "find it"}},
                    {"name": "delegate_run", "arguments": {"agent": "writer", "input": "write it"}},
                ]
            },
            {"text": "both done"},
        ],
    )


def answers(run_id) -> list[str]:
    state = checkpoint_latest(run_id)
    return [json.loads(m["content"]).get("answer") for m in state.conversation if m["role"] == "tool"]


def assert_joined_once(run, children):
    parent = Run.objects.get(id=run.id)
    assert parent.status == "COMPLETED" and parent.final_message == "both done", (parent.status, parent.failure)
    assert answers(run.id) == ["the answer is 42", "roses are red"]
    assert Run.objects.filter(parent_id=run.id).count() == 2  # no child started twice
    # one join requeued the parent (a worker the node drains after the kill may also yield it: reason "drain")
    requeued = [e.payload["reason"] for e in Event.objects.filter(run=parent, type="run.requeued")]
    assert requeued.count("child_run") == 1, requeued
    assert all(status(c) == "COMPLETED" for c in children)
    for child in children:  # each child's work was done once: one answered model call
        assert ModelCall.objects.filter(run_id=child, status="completed").count() == 1
    invocations = [e.payload["invocation"] for e in Event.objects.filter(run=parent, type="tool.call.completed")]
    assert len(invocations) == len(set(invocations)) == 2  # each call answered once


def test_sigkill_of_the_parents_worker_right_after_it_suspended_loses_no_child_and_no_join(
    stack, lead, submit, tmp_path
):
    c = stack("finalize.after_transition=pause")
    pauses = Pauses(tmp_path, "finalize.after_transition")
    run = submit(agent="lead")
    wait_for(lambda: pauses.paused(run.id), timeout=60, message=f"the parent to suspend\n{c.output()[-3000:]}")
    assert status(run.id) == "WAITING_FOR_APPROVAL"
    children = list(Run.objects.filter(parent_id=run.id).order_by("created_at").values_list("id", flat=True))
    assert len(children) == 2  # committed with the suspension, before the worker dies

    os.kill(pauses.pid(run.id), signal.SIGKILL)

    def parent_ended():
        pauses.release_all_but()  # the children's workers pause after their ends too: let them go
        return status(run.id) in TERMINAL

    wait_for(parent_ended, timeout=120, message=f"the parent to end\n{c.output()[-3000:]}")
    assert_joined_once(run, children)


def test_sigkill_of_the_worker_finishing_the_last_child_loses_no_join(stack, lead, submit, tmp_path):
    c = stack("finalize.before_transition=pause", AGENTRT_TENANT_MAX_RUNNING=2)  # both children leased at once
    pauses = Pauses(tmp_path, "finalize.before_transition")
    run = submit(agent="lead")
    wait_for(lambda: pauses.paused(run.id), timeout=60, message=f"the parent to suspend\n{c.output()[-3000:]}")
    pauses.release(run.id)
    wait_for(lambda: Run.objects.filter(parent_id=run.id).count() == 2, timeout=30, message="the children")
    first, last = Run.objects.filter(parent_id=run.id).order_by("created_at").values_list("id", flat=True)
    wait_for(
        lambda: pauses.paused(first) and pauses.paused(last),
        timeout=60,
        message=f"both children at their terminal transition\n{c.output()[-3000:]}",
    )
    pauses.release(first)
    wait_for(lambda: status(first) == "COMPLETED", timeout=30, message="the first child to end")
    assert status(run.id) == "WAITING_FOR_APPROVAL"  # not the last: the parent still waits

    os.kill(pauses.pid(last), signal.SIGKILL)  # the last child's worker dies in its terminal path

    wait_for(lambda: status(run.id) in TERMINAL, timeout=120, message=f"the parent to end\n{c.output()[-3000:]}")
    assert_joined_once(run, [first, last])
    assert Event.objects.filter(run_id=last, type="lease.taken_over").count() == 1  # Resume took the child over
