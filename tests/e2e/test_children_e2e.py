"""Child runs end to end through a real `qcluster` (issue 15 §1, "Evidence"):
a parent delegating to two children in one batch and answering with both
results; one child failing; the parent cancelled while its children run."""

from __future__ import annotations

import sys

import pytest

from runs.models import Event, ModelCall, Run, ToolInvocation
from runs.providers import PROVIDERS
from runs.services.lifecycle import run_cancel
from tests.conftest import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

RELAY = "tests.tool_modules.relay_provider"


@pytest.fixture
def relay():
    """This process validates the lead's definition, so it registers the relay model too (as every process
    of the cluster does, through AGENTRT_PROVIDER_MODULES)."""
    snapshot = PROVIDERS.snapshot()
    import tests.tool_modules.relay_provider  # noqa: F401

    yield
    PROVIDERS.restore(snapshot)
    sys.modules.pop(RELAY, None)


def status(run_id) -> str:
    return Run.objects.filter(id=run_id).values_list("status", flat=True).get()


def ended(run_id):
    return lambda: status(run_id) in ("COMPLETED", "FAILED", "CANCELLED")


def lead(load_agent, **work):
    return load_agent(
        name="lead",
        model={"provider": "relay", "delegate": [{"agent": a, "input": i} for a, i in work.items()]},
        tools=("delegate_run",),
        delegates=sorted(work),
    )


def test_a_parent_delegates_two_children_in_one_batch_and_answers_with_both_results(relay, cluster, load_agent, submit):
    load_agent(
        name="researcher", turns=[{"text": "the answer is 42", "usage": {"input_tokens": 5, "output_tokens": 3}}]
    )
    load_agent(name="writer", turns=[{"text": "roses are red", "usage": {"input_tokens": 4, "output_tokens": 2}}])
    lead(load_agent, researcher="find the answer", writer="write a poem")
    c = cluster(AGENTRT_LEASE_SECONDS=3, AGENTRT_PROVIDER_MODULES=RELAY)
    run = submit(agent="lead", text="research and write")

    wait_for(ended(run.id), timeout=90, message=f"the parent to end\n{c.output()}")

    parent = Run.objects.get(id=run.id)
    assert parent.status == "COMPLETED", (parent.status, parent.failure)
    assert parent.final_message == "the answer is 42 | roses are red"
    children = list(Run.objects.filter(parent=parent).order_by("created_at"))
    assert [(ch.agent.name, ch.status) for ch in children] == [("researcher", "COMPLETED"), ("writer", "COMPLETED")]
    for child in children:  # each ran once
        assert Event.objects.filter(run=child, type="run.claimed").count() == 1
        assert ModelCall.objects.filter(run=child).count() == 1
    assert [e.payload for e in Event.objects.filter(run=parent, type="run.requeued")] == [{"reason": "child_run"}]
    # additive usage: the parent's two model calls (2 in / 1 out each) and its children's
    assert (parent.usage["input_tokens"], parent.usage["output_tokens"]) == (2 * 2 + 5 + 4, 2 * 1 + 3 + 2)
    # the delegating turn was refunded; the children's one step and model call each are the parent's usage too
    assert parent.usage["steps"] == 1 + 2 and parent.usage["model_calls"] == 1 + 2


def test_a_failing_child_reaches_the_parents_model_as_child_run_failed(relay, cluster, load_agent, submit):
    load_agent(name="researcher", turns=[{"text": "the answer is 42"}])
    load_agent(name="writer", turns=[{"error": "permanent"}])
    lead(load_agent, researcher="find the answer", writer="write a poem")
    c = cluster(AGENTRT_LEASE_SECONDS=3, AGENTRT_PROVIDER_MODULES=RELAY)
    run = submit(agent="lead")

    wait_for(ended(run.id), timeout=90, message=f"the parent to end\n{c.output()}")

    parent = Run.objects.get(id=run.id)
    assert parent.status == "COMPLETED", (parent.status, parent.failure)
    first, failed = parent.final_message.split(" | ")
    assert first == "the answer is 42"
    assert failed.startswith("child_run_failed: the child run failed: model_permanent_error")
    writer = Run.objects.get(parent=parent, agent__name="writer")
    assert writer.status == "FAILED"
    assert ToolInvocation.objects.get(id=writer.parent_invocation).status == "failed"


def test_cancelling_the_parent_while_its_children_run_cancels_them(cluster, load_agent, submit):
    slow = [{"text": "too late", "delay_ms": 60_000}]
    load_agent(name="researcher", turns=slow)
    load_agent(name="writer", turns=slow)
    load_agent(
        name="lead",
        tools=("delegate_run",),
        delegates=["researcher", "writer"],
        turns=[
            {
                "tool_calls": [
                    {"name": "delegate_run", "arguments": {"agent": "researcher", "input": "a"}},
                    {"name": "delegate_run", "arguments": {"agent": "writer", "input": "b"}},
                ]
            },
            {"text": "never"},
        ],
    )
    c = cluster(AGENTRT_LEASE_SECONDS=3, AGENTRT_WORKERS=3, AGENTRT_TENANT_MAX_RUNNING=2)  # both children at once
    run = submit(agent="lead")

    def both_running():
        return list(Run.objects.filter(parent_id=run.id).values_list("status", flat=True)) == ["RUNNING"] * 2

    wait_for(both_running, timeout=60, message=f"both children to run\n{c.output()}")
    assert run_cancel(run=Run.objects.get(id=run.id), by="alice") == "CANCELLED"

    children = list(Run.objects.filter(parent_id=run.id))
    for child in children:
        wait_for(ended(child.id), timeout=30, message=f"child {child.id} to stop\n{c.output()}")
    assert [status(ch.id) for ch in children] == ["CANCELLED", "CANCELLED"]
    assert status(run.id) == "CANCELLED"
    assert not Event.objects.filter(run_id=run.id, type="run.requeued").exists()
    assert not Event.objects.filter(run__in=children, type="model.response.completed").exists()
