"""Control tools by declaration (issue 13, item 3): a tool of any name that
declares `control="ask_user"` or `control="delegate"` suspends its run the way
the built-in `ask_user` and `delegate_run` do, and its function never runs —
the pipeline reads the declaration, not the name. Driven in-process on the
real PostgreSQL schema; mutant `control_tested_by_name` puts a name check
back and these tests catch it."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, Field

from checkpoints.repository import checkpoint_latest
from runs.models import Event, Run, ToolInvocation
from runs.runtime.executor import run_drive
from runs.services.inputs import run_input
from runs.tools import REGISTRY, register

pytestmark = pytest.mark.django_db(transaction=True)


class Question(BaseModel):
    question: str = Field(min_length=1)


class Work(BaseModel):
    agent: str
    input: str


@pytest.fixture
def called():
    """Registers `clarify` (ask_user) and `spawn` (delegate); yields the calls their functions got."""
    calls: list[str] = []

    @register(name="clarify", read_only=True, control="ask_user")
    def clarify(args: Question, ctx):
        calls.append("clarify")
        return {"answer": "the function ran instead of asking"}

    @register(name="spawn", read_only=True, control="delegate")
    def spawn(args: Work, ctx):
        calls.append("spawn")
        return {"answer": "the function ran instead of delegating"}

    yield calls
    REGISTRY.unregister("clarify")
    REGISTRY.unregister("spawn")


def reload(run) -> Run:
    return Run.objects.get(id=run.id)


def test_a_tool_of_another_name_declared_ask_user_suspends_for_user_input(called, load_agent, submit):
    load_agent(
        turns=[
            {"tool_calls": [{"name": "clarify", "arguments": {"question": "Which region?"}}]},
            {"text": "deploying"},
        ],
        tools=("clarify",),
    )
    run = submit()
    assert run_drive(run_id=run.id).kind.value == "suspended"
    row = reload(run)
    assert row.status == "WAITING_FOR_USER" and row.lease_owner is None
    assert Event.objects.get(run=run, type="run.waiting_for_user").payload["question"] == "Which region?"
    call = ToolInvocation.objects.get(run=run)
    assert (call.tool_name, call.status, call.suspended_kind) == ("clarify", "awaiting_approval", "user")

    run_input(run=row, text="eu-west")
    run_drive(run_id=run.id)
    row = reload(run)
    assert row.status == "COMPLETED" and row.final_message == "deploying"
    assert ToolInvocation.objects.get(run=run).result == {"answer": "eu-west"}
    assert called == []  # a control tool's function is never called


def test_a_tool_of_another_name_declared_delegate_starts_a_child_run(called, load_agent, submit):
    load_agent(name="helper", turns=[{"text": "H: done"}])
    load_agent(
        name="lead",
        turns=[
            {"tool_calls": [{"name": "spawn", "arguments": {"agent": "helper", "input": "look it up"}}]},
            {"text": "lead done"},
        ],
        tools=("spawn",),
        delegates=["helper"],
    )
    parent = submit(agent="lead")
    assert run_drive(run_id=parent.id).kind.value == "suspended"
    assert reload(parent).status == "WAITING_FOR_APPROVAL"
    (child,) = Run.objects.filter(parent_id=parent.id)
    assert child.agent.name == "helper" and child.input == "look it up"

    assert run_drive(run_id=child.id).kind.value == "completed"
    run_drive(run_id=parent.id)
    assert reload(parent).status == "COMPLETED" and reload(parent).final_message == "lead done"
    (answer,) = [m for m in checkpoint_latest(parent.id).conversation if m["role"] == "tool"]
    assert json.loads(answer["content"])["answer"] == "H: done"
    done = Event.objects.get(run=parent, type="tool.call.completed").payload
    assert done["tool"] == "spawn" and done["child_run"] == str(child.id)
    assert called == []


def test_a_control_tool_must_take_the_arguments_the_runtime_reads():
    with pytest.raises(ValueError, match="a control='ask_user' tool takes the arguments question"):

        @register(name="ask_nothing", read_only=True, control="ask_user", parameters={"type": "object"})
        def ask_nothing(arguments, context):
            return None

    assert REGISTRY.spec("ask_nothing") is None
