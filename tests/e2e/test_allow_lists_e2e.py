"""Issue 34 item 4 at run time, through a real `qcluster`: a tenant's
`allowed_tools` / `allowed_endpoints` narrowed after an agent was published
still hold. A call of a tool no longer allowed is a failed result
`tool_not_allowed` the model sees and nothing is executed (the HTTP sink
receives nothing) — in a fresh batch, for an approved call that waited, and
in a child run (same tenant, same lists); an endpoint no longer allowed fails
the run `endpoint_not_allowed` before the model is called. Null lists keep
today's behaviour. And the security review's attack (N4) through the worker:
another tenant's run of examples/payments' `charge_card` charges nothing.
(Publishing is refused too: tests/security/test_allow_lists.py.)"""

from __future__ import annotations

import json

import pytest

from approvals.models import Approval
from approvals.services import approval_decide
from checkpoints.repository import checkpoint_latest
from examples.payments.fake_gateway import FakeGateway
from examples.payments.models import ChargeJournal
from runs.models import Event, ModelCall, Run, ToolInvocation
from runs.services import agent_load, run_submit, tenant_configure, tenant_create
from tests.conftest import wait_for
from tests.providers.conftest import PRICES
from tests.providers.fake_openai import FakeOpenAI, text_stream

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")


def status(run) -> str:
    return Run.objects.filter(id=run.id).values_list("status", flat=True).get()


def settled(run, c, wanted=TERMINAL) -> Run:
    wait_for(lambda: status(run) in wanted, timeout=90, message=f"run {run.id} to reach {wanted}\n{c.output()[-3000:]}")
    return Run.objects.get(id=run.id)


def post(sink, amount: int = 1) -> dict:
    return {"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": amount}}}


def echo(text: str) -> dict:
    return {"name": "echo", "arguments": {"text": text}}


def not_run(run, tool: str) -> ToolInvocation:
    """The call of `tool`: failed `tool_not_allowed`, never executed, and the model was told."""
    call = ToolInvocation.objects.get(run=run, tool_name=tool)
    assert call.status == "failed" and call.result["error"] == "tool_not_allowed", (call.status, call.result)
    assert call.effect_sent_at is None and call.attempt in (0, None), call.attempt
    failed = [e.payload for e in Event.objects.filter(run=run, type="tool.call.failed")]
    assert [(p["executed"], p["result"]["error"]) for p in failed if p["tool"] == tool] == [
        (False, "tool_not_allowed")
    ], failed
    assert not Event.objects.filter(run=run, type="tool.call.started", payload__tool=tool).exists()
    return call


def test_a_tool_narrowed_after_publishing_fails_the_call_tool_not_allowed_and_nothing_is_sent(
    cluster, load_agent, submit, sink, tenant
):
    load_agent(turns=[{"tool_calls": [post(sink), echo("still here")]}, {"text": "done"}], tools=("http_post", "echo"))
    c = cluster(AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host, AGENTRT_LEASE_SECONDS=5)

    before = settled(submit(), c)  # null lists: today's behaviour
    assert before.status == "COMPLETED" and len(sink.sends) == 1, before.failure

    tenant_configure(tenant=tenant, allowed_tools=["echo"])  # the version stays published; the list narrows
    run = settled(submit(), c)
    assert run.status == "COMPLETED" and run.final_message == "done", run.failure
    call = not_run(run, "http_post")
    assert "not allowed for this tenant" in call.result["message"]
    assert ToolInvocation.objects.get(run=run, tool_name="echo").status == "completed"  # the rest of the batch ran
    assert len(sink.sends) == 1  # nothing more was sent
    # The model was shown the refusal as the call's result (and answered after it).
    (shown,) = [m for m in checkpoint_latest(run.id).conversation if m.get("tool_call_id") == call.call_id]
    assert json.loads(shown["content"])["error"] == "tool_not_allowed"


def test_an_approved_call_that_waited_while_the_list_narrowed_is_refused_when_it_would_run(
    cluster, load_agent, submit, sink, tenant, operator
):
    load_agent(
        turns=[{"tool_calls": [post(sink, 500)]}, {"text": "done"}],
        tools=("http_post",),
        policy={"default": "allow", "rules": [{"tool": "http_post", "decision": "require_approval"}]},
    )
    c = cluster(AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host, AGENTRT_LEASE_SECONDS=5)
    run = submit()
    settled(run, c, ("WAITING_FOR_APPROVAL",))
    tenant_configure(tenant=tenant, allowed_tools=["echo"])
    approval = Approval.objects.get(run=run, status="pending")
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash, via="api")

    row = settled(run, c)
    assert row.status == "COMPLETED" and row.final_message == "done", row.failure
    call = ToolInvocation.objects.get(run=run, tool_name="http_post")
    assert call.status == "failed" and call.result["error"] == "tool_not_allowed", call.result
    assert call.effect_sent_at is None
    assert sink.sends == []


def test_a_child_run_is_held_to_its_tenants_lists(cluster, load_agent, submit, sink, tenant):
    load_agent(name="poster", turns=[{"tool_calls": [post(sink)]}, {"text": "child done"}], tools=("http_post",))
    load_agent(
        name="lead",
        tools=("delegate_run",),
        delegates=["poster"],
        turns=[
            {"tool_calls": [{"name": "delegate_run", "arguments": {"agent": "poster", "input": "post it"}}]},
            {"text": "lead done"},
        ],
    )
    tenant_configure(tenant=tenant, allowed_tools=["delegate_run"])
    c = cluster(AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host, AGENTRT_LEASE_SECONDS=5)

    run = settled(submit(agent="lead"), c)
    assert run.status == "COMPLETED" and run.final_message == "lead done", run.failure
    (child,) = Run.objects.filter(parent=run)
    assert child.status == "COMPLETED" and child.tenant_id == tenant.id
    not_run(child, "http_post")
    assert sink.sends == []


def test_an_endpoint_narrowed_after_publishing_fails_the_run_before_the_model_is_called(
    cluster, load_agent, submit, settings, tenant
):
    fake = FakeOpenAI().start()
    try:
        endpoint = {"provider": "openai", "base_url": fake.base_url, "api_key_env": "AGENTRT_FAKE_KEY"}
        endpoints = {"fake": endpoint, "local": {**endpoint, "api_key_env": "AGENTRT_LOCAL_KEY"}}
        settings.AGENTRT_MODEL_ENDPOINTS = endpoints
        settings.AGENTRT_MODEL_PRICES = PRICES
        load_agent(name="helper", model={"provider": "openai", "endpoint": "fake", "model": "test-model"}, tools=())
        c = cluster(
            AGENTRT_MODEL_ENDPOINTS=json.dumps(endpoints),
            AGENTRT_MODEL_PRICES=json.dumps(PRICES),
            AGENTRT_FAKE_KEY="fake-model-key-CANARY",
            AGENTRT_LEASE_SECONDS=5,
        )
        fake.push(text_stream("hello"))
        before = settled(submit(agent="helper"), c)  # null lists: the endpoint is used as before
        assert before.status == "COMPLETED" and before.final_message == "hello", before.failure
        assert len(fake.requests) == 1

        tenant_configure(tenant=tenant, allowed_endpoints=["local"])
        run = settled(submit(agent="helper"), c)
        assert run.status == "FAILED"
        assert (run.failure["reason"], run.failure["error_class"]) == ("endpoint_not_allowed", "EndpointNotAllowed")
        assert "'fake'" in run.failure["message"] and "AGENTRT_FAKE_KEY" not in json.dumps(run.failure)
        assert len(fake.requests) == 1  # the model was never called: no request, no key sent
        assert not ModelCall.objects.filter(run=run).exists()
    finally:
        fake.close()


def test_the_review_attack_another_tenants_run_of_charge_card_charges_nothing(cluster, tenant):
    """The review's `evil-cashier` (published while evil's lists were null, as then) run in a real worker:
    examples/payments refuses evil's principal; acme's own run charges."""
    gateway = FakeGateway().start()
    try:
        cashier = {
            "name": "cashier",
            "instructions": "charge",
            "model": {
                "provider": "scripted",
                "turns": [
                    {
                        "tool_calls": [
                            {"name": "charge_card", "arguments": {"customer": "cus_acme0001", "amount_cents": 49999}}
                        ]
                    },
                    {"text": "charged"},
                ],
            },
            "tools": ["charge_card"],
        }
        evil, eve = tenant_create(name="evil", username="eve")
        agent_load(tenant=evil, definition=cashier)
        agent_load(tenant=tenant, definition=cashier)
        c = cluster(PAYMENTS_GATEWAY_URL=gateway.url, PAYMENTS_TENANT="acme", AGENTRT_LEASE_SECONDS=5)

        attack, _ = run_submit(tenant=evil, agent="cashier", input="charge", principal=eve)
        row = settled(attack, c)
        assert row.status == "COMPLETED", row.failure
        call = ToolInvocation.objects.get(run=attack)
        assert call.status == "failed" and call.result["error"] == "tenant_not_allowed", call.result
        assert gateway.posts == [] and not ChargeJournal.objects.exists()

        own, _ = run_submit(tenant=tenant, agent="cashier", input="charge")
        assert settled(own, c).status == "COMPLETED"
        assert ToolInvocation.objects.get(run=own).result["status"] == "succeeded"
        assert len(gateway.posts) == 1
    finally:
        gateway.close()
