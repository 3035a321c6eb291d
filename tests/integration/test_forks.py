"""Forks (issue 37 items 1 and 2), executed in-process on the real schema: the
conversation through the fork's step comes from the original's record (its
checkpoints, or its log when they are gone), nothing before it runs again,
and every side effect after it waits for a person whose card says what the
original did there."""

from __future__ import annotations

import pytest

from approvals.models import Approval
from approvals.services import approval_decide
from checkpoints.models import Checkpoint
from checkpoints.repository import checkpoint_current, state_through
from runs.errors import InvalidInput, PublishForbidden, RunNotForkable
from runs.models import Event, Run, ToolInvocation
from runs.runtime.executor import run_drive
from runs.services.lineage import run_fork

pytestmark = pytest.mark.django_db(transaction=True)


def post(sink, n):
    return {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"effect": n}}}]}


def two_effects(load_agent, sink, name="payer", last="paid twice", **kw):
    """Step 1 sends effect 1, step 2 effect 2, step 3 answers."""
    return load_agent(name=name, turns=[post(sink, 1), post(sink, 2), {"text": last}], tools=("http_post",), **kw)


def reload(run):
    return Run.objects.select_related("agent").get(id=run.id)


def bodies(sink):
    return [s["body"] for s in sink.sends]


def finished(load_agent, submit, sink, **kw):
    two_effects(load_agent, sink, **kw)
    run = submit(agent=kw.get("name", "payer"), text="pay")
    run_drive(run_id=run.id)
    run = reload(run)
    assert run.status == "COMPLETED" and run.step_count == 3, (run.status, run.failure)
    assert bodies(sink) == [{"effect": 1}, {"effect": 2}]
    return run


def approve(operator, approval):
    approval_decide(
        user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash, reason="", via="api"
    )


def test_a_fork_from_step_1_sends_the_second_effect_once_after_its_approval(load_agent, submit, sink, operator):
    original = finished(load_agent, submit, sink)
    fork = run_fork(run=original, from_step=1, principal=operator)
    assert fork.forked_from_id == original.id and fork.forked_from_step == 1 and fork.fork_effects == "approve"
    assert fork.session_id != original.session_id and fork.status == "QUEUED"
    # Its conversation is the original's through step 1: the input, the first call and its result.
    seed = checkpoint_current(fork)
    assert seed.step == 1
    assert [m["role"] for m in seed.conversation] == ["user", "assistant", "tool"]
    assert seed.conversation[1]["tool_calls"][0]["arguments"] == original_arguments(original, 1)

    run_drive(run_id=fork.id)
    fork = reload(fork)
    assert fork.status == "WAITING_FOR_APPROVAL"
    assert bodies(sink) == [{"effect": 1}, {"effect": 2}]  # nothing sent yet, the first effect never again
    approval = Approval.objects.get(run=fork)
    facts = approval.presentation["fork"]
    assert facts["run"] == str(original.id) and facts["step"] == 1
    assert facts["position"] == {"step": 2, "call_index": 0}
    assert facts["same_tool"] is True and facts["same_arguments"] is True
    assert facts["original"]["tool"] == "http_post" and facts["original"]["arguments"]["json"] == {"effect": 2}
    assert approval.presentation["notice"].startswith(f"This run is a fork of run {original.id} at step 1")
    assert "the same call, with the same arguments" in approval.presentation["notice"]

    approve(operator, approval)
    run_drive(run_id=fork.id)
    fork = reload(fork)
    assert fork.status == "COMPLETED" and fork.final_message == "paid twice"
    assert bodies(sink) == [{"effect": 1}, {"effect": 2}, {"effect": 2}]  # the second, once, after the approval
    # Its own steps are 2 and 3 (budgeted from 1); steps up to 1 are the original's, never run here.
    assert set(ToolInvocation.objects.filter(run=fork).values_list("step_number", flat=True)) == {2}
    assert fork.usage["steps"] == 2 and fork.step_count == 3
    assert sorted(
        set(Event.objects.filter(run=fork, type="model.request.started").values_list("payload__step", flat=True))
    ) == [2, 3]
    assert Event.objects.get(run=fork, type="run.created").payload["forked_from"] == {
        "run": str(original.id),
        "step": 1,
    }


def original_arguments(run, step):
    return ToolInvocation.objects.filter(run=run, step_number=step).values_list("raw_arguments", flat=True).get()


def test_the_card_says_when_the_fork_calls_with_other_arguments(load_agent, submit, sink, operator):
    original = finished(load_agent, submit, sink)
    changed = load_agent(name="payer", turns=[post(sink, 1), post(sink, 99), {"text": "paid"}], tools=("http_post",))
    fork = run_fork(run=original, from_step=1, agent_version=changed.version, principal=operator)
    assert fork.agent_version == changed.version
    run_drive(run_id=fork.id)
    approval = Approval.objects.get(run=fork)
    facts = approval.presentation["fork"]
    assert facts["same_tool"] is True and facts["same_arguments"] is False
    assert "the same tool with other arguments" in approval.presentation["notice"]
    assert bodies(sink) == [{"effect": 1}, {"effect": 2}]


def test_a_fork_under_the_policy_needs_the_publish_permission(load_agent, submit, sink, operator, tenant):
    from django.contrib.auth import get_user_model

    original = finished(load_agent, submit, sink)
    member = get_user_model().objects.get(username="alice")
    with pytest.raises(PublishForbidden):
        run_fork(run=original, from_step=1, effects="policy", principal=member, may_publish=False)
    fork = run_fork(run=original, from_step=1, effects="policy", principal=operator, may_publish=True)
    run_drive(run_id=fork.id)
    assert reload(fork).status == "COMPLETED"  # the agent's policy allows every call, as for a fresh run
    assert bodies(sink) == [{"effect": 1}, {"effect": 2}, {"effect": 2}]


def test_a_fork_of_a_fork_continues_its_parents_conversation(load_agent, submit, sink, operator):
    original = finished(load_agent, submit, sink)
    first = run_fork(run=original, from_step=1, principal=operator, input="and once more")
    assert first.input == "and once more"
    run_drive(run_id=first.id)
    approve(operator, Approval.objects.get(run=first))
    run_drive(run_id=first.id)
    first = reload(first)
    assert first.status == "COMPLETED"
    second = run_fork(run=first, from_step=2, principal=operator)
    seed = checkpoint_current(second)
    assert seed.step == 2
    roles = [m["role"] for m in seed.conversation]
    assert roles == ["user", "assistant", "tool", "user", "assistant", "tool"]
    assert seed.conversation[3]["content"] == "and once more"
    run_drive(run_id=second.id)
    assert reload(second).status == "COMPLETED"  # step 3 answers: no call, nothing to approve
    # Forking the fork before its own steps reads the original's.
    early = run_fork(run=first, from_step=0, principal=operator)
    assert [m["role"] for m in checkpoint_current(early).conversation] == ["user"]
    assert reload(original).forks.count() == 1 and reload(first).forks.count() == 2


def test_a_run_whose_checkpoints_are_gone_forks_from_its_log(load_agent, submit, sink, operator):
    original = finished(load_agent, submit, sink)
    with_chain = state_through(original, 2).state
    Checkpoint.objects.filter(run=original).delete()
    from_log = state_through(original, 2).state
    assert with_chain is not None and from_log is not None
    assert from_log.conversation == with_chain.conversation and from_log.step == 2
    fork = run_fork(run=original, from_step=2, principal=operator)
    run_drive(run_id=fork.id)
    assert reload(fork).status == "COMPLETED" and bodies(sink) == [{"effect": 1}, {"effect": 2}]
    # ... and a fork whose own seed is gone is rebuilt the same way.
    again = run_fork(run=original, from_step=1, principal=operator)
    expected = checkpoint_current(again).conversation
    Checkpoint.objects.filter(run=again).delete()
    assert checkpoint_current(reload(again)).conversation == expected


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"from_step": 4}, "from_step"),
        ({"from_step": -1}, "from_step"),
        ({"from_step": "1"}, "from_step"),
        ({"from_step": True}, "from_step"),
        ({"from_step": 1, "agent_version": "nope"}, "agent_version"),
        ({"from_step": 1, "agent_version": "00000000-0000-0000-0000-000000000000"}, "agent_version"),
        ({"from_step": 1, "effects": "yolo"}, "effects"),
        ({"from_step": 1, "input": "   "}, "input"),
    ],
)
def test_bad_fork_input_names_the_field(load_agent, submit, sink, kwargs, field):
    original = finished(load_agent, submit, sink)
    with pytest.raises(InvalidInput) as caught:
        run_fork(run=original, **kwargs)
    assert field in caught.value.fields, caught.value.fields
    assert Run.objects.count() == 1


def test_a_step_with_a_call_still_waiting_is_not_forkable(load_agent, submit, sink, operator):
    policy = {"default": "allow", "rules": [{"tool": "http_post", "decision": "require_approval"}]}
    two_effects(load_agent, sink, policy=policy)
    run = submit(agent="payer", text="pay")
    run_drive(run_id=run.id)
    run = reload(run)
    assert run.status == "WAITING_FOR_APPROVAL" and run.step_count == 1
    with pytest.raises(InvalidInput) as caught:
        run_fork(run=run, from_step=1, principal=operator)
    assert "no recorded result" in caught.value.fields["from_step"][0]
    assert run_fork(run=run, from_step=0, principal=operator).forked_from_step == 0  # its start is


def test_a_child_run_is_not_forked(load_agent, submit, operator):
    load_agent(name="helper", turns=[{"text": "helped"}])
    load_agent(
        name="lead",
        tools=("delegate_run",),
        delegates=["helper"],
        turns=[
            {"tool_calls": [{"name": "delegate_run", "arguments": {"agent": "helper", "input": "x"}}]},
            {"text": "ok"},
        ],
    )
    lead = submit(agent="lead")
    run_drive(run_id=lead.id)
    child = Run.objects.get(parent_id=lead.id)
    with pytest.raises(RunNotForkable):
        run_fork(run=reload(child), from_step=0, principal=operator)


def test_a_run_submitted_into_a_forks_session_sees_no_empty_message(load_agent, submit, sink, operator):
    original = finished(load_agent, submit, sink)
    fork = run_fork(run=original, from_step=2, effects="policy", principal=operator, may_publish=True)
    run_drive(run_id=fork.id)
    assert reload(fork).status == "COMPLETED" and fork.input == ""
    follow_up = submit(agent="payer", text="and now?", session=fork.session_id)
    history = checkpoint_current(follow_up).conversation
    assert [m["role"] for m in history] == ["assistant", "user"]  # the fork's answer, then the new input
    assert all(m.get("content") for m in history)
