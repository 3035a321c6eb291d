"""Child runs and the join (issue 15 §1, seed 002 M6), executed in-process on
the real PostgreSQL schema: a `delegate_run` batch suspends its run with kind
`child_run` and starts the children in that transaction; each child's terminal
transaction answers its call and the last one requeues the parent; failures,
cancels, deadlines and budgets reach the parent as the seed says."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from approvals.models import Approval
from approvals.services import approval_decide
from checkpoints.repository import checkpoint_latest
from maintenance.sweeps.expiry import sweep_expiry
from runs.clock import CLOCK
from runs.models import Event, ModelCall, Run, ToolInvocation
from runs.runtime.executor import run_drive
from runs.runtime.resume import run_resume
from runs.services.inputs import run_input
from runs.services.lifecycle import run_cancel
from tests.crash import die_at

pytestmark = pytest.mark.django_db(transaction=True)


def delegate(agent: str, text: str) -> dict:
    return {"name": "delegate_run", "arguments": {"agent": agent, "input": text}}


def reload(run) -> Run:
    return Run.objects.get(id=run.id)


def children_of(run) -> list[Run]:
    return list(Run.objects.filter(parent_id=run.id).order_by("created_at", "id"))


def types(run) -> list[str]:
    return list(Event.objects.filter(run_id=run.id).order_by("sequence").values_list("type", flat=True))


def tool_messages(run) -> list[dict]:
    state = checkpoint_latest(run.id)
    return [m for m in state.conversation if m["role"] == "tool"]


@pytest.fixture
def team(load_agent):
    """Two workers and a lead that may delegate to both."""

    def make(lead_turns, *, researcher=None, writer=None, lead_limits=None, tools=("delegate_run",), **extra):
        load_agent(
            name="researcher",
            turns=researcher or [{"text": "R: the answer is 42", "usage": {"input_tokens": 10, "output_tokens": 4}}],
        )
        load_agent(
            name="writer",
            turns=writer or [{"text": "W: a short poem", "usage": {"input_tokens": 7, "output_tokens": 3}}],
            tools=("echo", "ask_user"),
        )
        return load_agent(
            name="lead",
            turns=lead_turns,
            tools=tools,
            delegates=extra.pop("delegates", ["researcher", "writer"]),
            limits=lead_limits,
            **extra,
        )

    return make


def suspended_with_two_children(team, submit, **kw):
    team(
        [
            {"tool_calls": [delegate("researcher", "find the answer"), delegate("writer", "write a poem")]},
            {"text": "both done"},
        ],
        **kw,
    )
    parent = submit(agent="lead", text="do both")
    outcome = run_drive(run_id=parent.id)
    assert outcome.kind.value == "suspended", outcome
    return reload(parent), children_of(parent)


# -- the suspension --------------------------------------------------------------------------------------


def test_two_delegate_calls_in_one_batch_start_two_children_and_the_parent_waits_without_a_lease(team, submit):
    parent, children = suspended_with_two_children(team, submit, lead_limits={"max_steps": 10, "max_model_calls": 8})

    assert parent.status == "WAITING_FOR_APPROVAL"
    assert parent.lease_owner is None and parent.lease_expires_at is None
    assert [c.agent.name for c in children] == ["researcher", "writer"]
    assert [c.input for c in children] == ["find the answer", "write a poem"]
    for child in children:
        assert child.status == "QUEUED" and child.parent_id == parent.id and child.tenant_id == parent.tenant_id
        assert child.session_id != parent.session_id  # a child is an ordinary run, in a session of its own
        assert child.deadline_at == parent.deadline_at
        # an equal share of what remains of the parent's (its step and model call were refunded; 2 tool calls
        # spent): two children together never exceed it
        assert (child.limits["max_steps"], child.limits["max_model_calls"]) == (10 // 2, 8 // 2)
        assert child.limits["max_tool_calls"] == (64 - 2) // 2
    waiting = Event.objects.get(run=parent, type="run.waiting_for_approval").payload
    assert waiting["kind"] == "child_run"
    assert [c["run"] for c in waiting["children"]] == [str(c.id) for c in children]
    calls = ToolInvocation.objects.filter(run=parent).order_by("call_index")
    assert [(i.status, i.suspended_kind) for i in calls] == [("awaiting_approval", "child_run")] * 2
    assert [c.parent_invocation for c in children] == [i.id for i in calls]
    created = Event.objects.get(run=children[0], type="run.created").payload
    assert created["parent"] == str(parent.id) and created["parent_invocation"] == str(calls[0].id)


def test_the_parent_answers_with_both_results_after_the_last_child_ends(team, submit):
    parent, (first, second) = suspended_with_two_children(team, submit)

    assert run_drive(run_id=first.id).kind.value == "completed"
    # not the last sibling: the parent still waits, its first call answered
    assert reload(parent).status == "WAITING_FOR_APPROVAL"
    assert "run.requeued" not in types(parent)
    answered = ToolInvocation.objects.get(id=first.parent_invocation)
    assert answered.status == "completed" and answered.result["answer"] == "R: the answer is 42"

    assert run_drive(run_id=second.id).kind.value == "completed"
    assert reload(parent).status == "QUEUED"
    requeued = [e.payload for e in Event.objects.filter(run=parent, type="run.requeued")]
    assert requeued == [{"reason": "child_run"}]

    assert run_drive(run_id=parent.id).kind.value == "completed"
    parent = reload(parent)
    assert parent.final_message == "both done"
    results = [json.loads(m["content"]) for m in tool_messages(parent)]
    assert [r["answer"] for r in results] == ["R: the answer is 42", "W: a short poem"]
    assert [r["run"] for r in results] == [str(first.id), str(second.id)]
    # the parent's budget counts its children's tokens
    assert (parent.usage["input_tokens"], parent.usage["output_tokens"]) == (17, 7)


def test_a_failed_child_gives_the_parent_a_child_run_failed_result_the_model_sees(team, submit):
    parent, (first, second) = suspended_with_two_children(team, submit, researcher=[{"error": "permanent"}])

    assert run_drive(run_id=first.id).kind.value == "failed"
    run_drive(run_id=second.id)
    run_drive(run_id=parent.id)

    parent = reload(parent)
    assert parent.status == "COMPLETED"
    failed, ok = tool_messages(parent)
    assert failed["is_error"] is True and ok["is_error"] is False
    content = json.loads(failed["content"])
    assert content["error"] == "child_run_failed"
    assert content["reason"] == "model_permanent_error" and content["status"] == "FAILED"
    assert content["run"] == str(first.id) and content["agent"] == "researcher"
    call = ToolInvocation.objects.get(id=first.parent_invocation)
    assert (call.status, call.outcome) == ("failed", "failed")
    event = Event.objects.get(run=parent, type="tool.call.failed", payload__invocation=str(call.id))
    assert event.payload["child_run"] == str(first.id)


def test_an_agent_delegates_only_to_the_agents_it_lists(team, submit, load_agent):
    load_agent(name="stranger", turns=[{"text": "hi"}])
    team(
        [
            {"tool_calls": [delegate("stranger", "x"), delegate("writer", "y")]},
            {"text": "done"},
        ],
        delegates=["researcher", "writer", "ghost"],
    )
    parent = submit(agent="lead")
    assert run_drive(run_id=parent.id).kind.value == "suspended"
    (child,) = children_of(parent)
    assert child.agent.name == "writer"
    refused = ToolInvocation.objects.get(run=parent, call_index=0)
    assert refused.status == "failed" and refused.result["error"] == "delegate_not_allowed"
    assert "'stranger'" in refused.result["message"] and "researcher, writer, ghost" in refused.result["message"]


def test_a_listed_agent_the_tenant_lacks_is_a_failed_result_and_nothing_waits(team, submit):
    team([{"tool_calls": [delegate("ghost", "boo")]}, {"text": "no ghost"}], delegates=["ghost"])
    parent = submit(agent="lead")

    assert run_drive(run_id=parent.id).kind.value == "completed"
    assert children_of(parent) == []
    (message,) = tool_messages(reload(parent))
    assert json.loads(message["content"])["error"] == "unknown_agent"


def test_a_turn_that_asks_the_user_starts_no_child(team, submit):
    team(
        [{"tool_calls": [{"name": "ask_user", "arguments": {"question": "which?"}}, delegate("writer", "y")]}],
        tools=("delegate_run", "ask_user"),
    )
    parent = submit(agent="lead")

    assert run_drive(run_id=parent.id).kind.value == "suspended"
    assert reload(parent).status == "WAITING_FOR_USER"
    assert children_of(parent) == []
    assert ToolInvocation.objects.get(run=parent, call_index=1).result["error"] == "control_conflict"


# -- the budget ------------------------------------------------------------------------------------------


def test_orchestration_only_turns_refund_their_step_and_model_call(team, submit):
    """max_steps 4: two delegating turns and the answer take three steps, of which the two orchestration-only
    ones are refunded; the two children's one step each are the parent's usage too (additive). Without the
    refund the third step would be the fifth charged one and fail max_steps_exceeded."""
    team(
        [{"tool_calls": [delegate("researcher", "one")]}, {"tool_calls": [delegate("writer", "two")]}, {"text": "ok"}],
        lead_limits={"max_steps": 4, "max_model_calls": 4, "synthesis_reserve_model_calls": 0},
    )
    parent = submit(agent="lead")
    for joined in range(2):
        assert run_drive(run_id=parent.id).kind.value == "suspended"
        assert reload(parent).usage["steps"] == joined and reload(parent).usage["model_calls"] == joined
        (child,) = [c for c in children_of(parent) if c.status == "QUEUED"]
        run_drive(run_id=child.id)

    assert run_drive(run_id=parent.id).kind.value == "completed"
    parent = reload(parent)
    assert parent.step_count == 3 and parent.usage["steps"] == 1 + 2 and parent.usage["model_calls"] == 1 + 2
    assert ModelCall.objects.filter(run=parent).values("step_number").distinct().count() == 3


def test_a_turn_that_also_calls_another_tool_is_not_refunded(team, submit):
    team(
        [{"tool_calls": [delegate("researcher", "one"), {"name": "echo", "arguments": {"text": "x"}}]}],
        tools=("delegate_run", "echo"),
    )
    parent = submit(agent="lead")
    run_drive(run_id=parent.id)
    usage = reload(parent).usage
    assert (usage["steps"], usage["model_calls"], usage["tool_calls"]) == (1, 1, 2)


def test_a_waiting_parent_fails_on_budget_when_its_childrens_tokens_exceed_it_and_the_rest_are_cancelled(team, submit):
    spend = [{"text": "spent", "usage": {"input_tokens": 1, "output_tokens": 60}}]
    team(
        [{"tool_calls": [delegate("researcher", "a"), delegate("writer", "b"), delegate("writer", "c")]}],
        researcher=spend,
        writer=spend,
        lead_limits={"max_output_tokens": 100},
    )
    parent = submit(agent="lead")
    run_drive(run_id=parent.id)
    first, second, third = children_of(parent)
    assert first.limits["max_output_tokens"] == 100 // 3  # each child's share of what remains

    # A child that goes over its share with the one call it had in flight fails on its own budget.
    run_drive(run_id=first.id)
    assert reload(first).status == "FAILED" and reload(first).failure["reason"] == "budget_exceeded"
    first = reload(first)

    assert reload(parent).status == "WAITING_FOR_APPROVAL" and reload(parent).usage["output_tokens"] == 60
    run_drive(run_id=second.id)

    parent = reload(parent)
    assert parent.status == "FAILED" and parent.failure["reason"] == "budget_exceeded"
    assert parent.failure["details"]["child_run"] == str(second.id)
    assert parent.usage["output_tokens"] == 120
    assert "run.claimed" not in types(parent)[types(parent).index("run.waiting_for_approval") :]
    third = reload(third)
    assert third.status == "CANCELLED"
    assert Event.objects.get(run=third, type="run.cancelled").payload["parent"] == str(parent.id)
    assert ToolInvocation.objects.get(id=third.parent_invocation).status == "cancelled"
    assert run_drive(run_id=third.id) is None  # its doorbell finds nothing to run


# -- cancel and deadline ---------------------------------------------------------------------------------


def test_cancelling_a_waiting_parent_cancels_its_queued_waiting_and_running_children(team, submit):
    parent, (first, second) = suspended_with_two_children(
        team, submit, writer=[{"tool_calls": [{"name": "ask_user", "arguments": {"question": "rhyme?"}}]}]
    )
    load_running = run_drive(run_id=second.id)  # the writer now waits for its user
    assert load_running.kind.value == "suspended" and reload(second).status == "WAITING_FOR_USER"
    from runs.runtime.queue import run_claim

    claim = run_claim(run_id=first.id, owner="busy-worker")  # the researcher is running somewhere

    assert run_cancel(run=reload(parent), by="alice") == "CANCELLED"

    assert reload(second).status == "CANCELLED"
    assert reload(first).status == "RUNNING" and reload(first).cancel_requested_at is not None
    assert set(ToolInvocation.objects.filter(run=parent).values_list("status", flat=True)) == {"cancelled"}
    # the running child's worker stops at its next observation point; the parent is not requeued by it
    from runs.domain.values import OutcomeKind, RunOutcome
    from runs.domain.writes import UnitOfWork
    from runs.runtime.finalize import finalize_detached

    finalize_detached(claim, RunOutcome(kind=OutcomeKind.CANCELLED), UnitOfWork())
    assert reload(first).status == "CANCELLED"
    assert reload(parent).status == "CANCELLED" and "run.requeued" not in types(parent)


def test_cancelling_one_child_answers_its_call_with_child_run_failed(team, submit):
    parent, (first, second) = suspended_with_two_children(team, submit)
    run_cancel(run=first, by="alice")
    run_drive(run_id=second.id)

    assert reload(parent).status == "QUEUED"
    call = ToolInvocation.objects.get(id=first.parent_invocation)
    assert call.result["error"] == "child_run_failed" and call.result["reason"] == "cancelled"


def test_a_child_past_the_parents_deadline_is_cancelled_and_the_parent_fails_on_it(team, submit):
    parent, (first, second) = suspended_with_two_children(team, submit)
    past = CLOCK.now() - timedelta(seconds=1)
    Run.objects.filter(id__in=[parent.id, first.id, second.id]).update(deadline_at=past)

    run_drive(run_id=first.id)
    run_drive(run_id=second.id)

    assert (reload(first).status, reload(second).status) == ("CANCELLED", "CANCELLED")
    assert reload(first).failure is None
    call = ToolInvocation.objects.get(id=first.parent_invocation)
    assert call.result["reason"] == "deadline_exceeded"
    run_drive(run_id=parent.id)
    parent = reload(parent)
    assert parent.status == "FAILED" and parent.failure["reason"] == "deadline_exceeded"


def test_the_deadline_sweep_fails_a_waiting_parent_and_cancels_its_children(team, submit):
    parent, children = suspended_with_two_children(team, submit)
    Run.objects.filter(id=parent.id).update(deadline_at=CLOCK.now() - timedelta(seconds=1))

    assert sweep_expiry()["deadline_exceeded"] == 1

    assert reload(parent).status == "FAILED"
    assert [reload(c).status for c in children] == ["CANCELLED", "CANCELLED"]


# -- approval and crashes --------------------------------------------------------------------------------


def test_a_delegate_call_that_needs_approval_starts_its_child_once_approved(team, submit, operator):
    team(
        [{"tool_calls": [delegate("writer", "y")]}, {"text": "ok"}],
        policy={"default": "allow", "rules": [{"tool": "delegate_run", "decision": "require_approval"}]},
    )
    parent = submit(agent="lead")
    run_drive(run_id=parent.id)
    assert children_of(parent) == []
    approval = Approval.objects.get(run=parent)
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash)

    assert run_drive(run_id=parent.id).kind.value == "suspended"
    (child,) = children_of(parent)
    run_drive(run_id=child.id)
    assert run_drive(run_id=parent.id).kind.value == "completed"
    # an orchestration-only turn, refunded when it delegated; the child's step is the parent's usage too
    assert reload(parent).usage["steps"] == 1 + 1


def test_a_parent_that_dies_before_its_suspension_commits_started_no_child_and_its_model_sees_the_calls_interrupted(
    team, submit, monkeypatch
):
    """The children start in the suspension's transaction: a worker that dies before it commits started none.
    The takeover answers the calls like any read-only call in flight (DESIGN §7): interrupted, ask again."""
    team(
        [
            {"tool_calls": [delegate("researcher", "a"), delegate("writer", "b")]},
            {"tool_calls": [delegate("writer", "b again")]},
            {"text": "ok"},
        ]
    )
    parent = submit(agent="lead")
    die_at(monkeypatch, parent, "finalize.before_transition")
    assert children_of(parent) == []

    assert run_resume(run_id=parent.id) == "continue"
    assert run_drive(run_id=parent.id).kind.value == "suspended"  # the model asked again (its second turn)
    (child,) = children_of(parent)
    assert child.input == "b again"
    first_turn = [json.loads(m["content"])["error"] for m in tool_messages(reload(parent))]
    assert first_turn == ["interrupted", "interrupted"]
    run_drive(run_id=child.id)
    assert run_drive(run_id=parent.id).kind.value == "completed"
    assert Run.objects.filter(parent_id=parent.id).count() == 1


def test_a_parent_that_dies_right_after_suspending_loses_no_child_and_no_join(team, submit, monkeypatch):
    team([{"tool_calls": [delegate("researcher", "a"), delegate("writer", "b")]}, {"text": "ok"}])
    parent = submit(agent="lead")
    die_at(monkeypatch, parent, "finalize.after_transition")
    parent = reload(parent)
    assert parent.status == "WAITING_FOR_APPROVAL" and parent.lease_owner is None
    first, second = children_of(parent)

    assert run_drive(run_id=parent.id) is None  # a redelivered doorbell of the dead worker finds a waiting run
    run_drive(run_id=first.id)
    run_drive(run_id=second.id)
    assert run_drive(run_id=parent.id).kind.value == "completed"
    assert Run.objects.filter(parent_id=parent.id).count() == 2
    assert [json.loads(m["content"])["status"] for m in tool_messages(reload(parent))] == ["COMPLETED"] * 2


def test_a_child_that_waits_for_its_user_joins_when_answered(team, submit):
    parent, (first, second) = suspended_with_two_children(
        team,
        submit,
        writer=[{"tool_calls": [{"name": "ask_user", "arguments": {"question": "rhyme?"}}]}, {"text": "rhymed"}],
    )
    run_drive(run_id=first.id)
    run_drive(run_id=second.id)
    assert reload(second).status == "WAITING_FOR_USER" and reload(parent).status == "WAITING_FOR_APPROVAL"
    run_input(run=reload(second), text="yes")
    run_drive(run_id=second.id)

    assert reload(parent).status == "QUEUED"
    assert ToolInvocation.objects.get(id=second.parent_invocation).result["answer"] == "rhymed"


def test_a_child_acts_for_whom_its_parent_acts(team, submit, operator):
    team([{"tool_calls": [delegate("writer", "y")]}])
    parent = submit(agent="lead", principal=operator)
    run_drive(run_id=parent.id)

    (child,) = children_of(parent)
    parent = reload(parent)
    assert parent.principal_user_id == operator.pk
    assert (child.principal_user_id, child.principal_scopes) == (parent.principal_user_id, parent.principal_scopes)
