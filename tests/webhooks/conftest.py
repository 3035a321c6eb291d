"""Fixtures of the hook and webhook tests."""

from __future__ import annotations

import pytest

APPROVER = {
    "default": "allow",
    "rules": [
        {"tool": "http_post", "decision": "require_approval", "when": {"arg": "json.amount", "op": "gt", "value": 100}}
    ],
}


@pytest.fixture
def receiver(settings):
    from .receiver import Receiver

    r = Receiver()
    settings.AGENTRT_WEBHOOK_ALLOWED_HOSTS = [r.host]
    yield r
    r.close()


@pytest.fixture
def hook_registry():
    """Register hooks in this process for one test; the registry is restored after."""
    from runs import hooks

    before = hooks.registered()
    yield hooks
    hooks._HOOKS.clear()
    hooks._HOOKS.update(before)


@pytest.fixture
def manager(tenant):
    """A staff member of `tenant` with webhooks.manage_webhooks (create_tenant --operator)."""
    from runs.services import tenant_create

    _, user = tenant_create(name=tenant.name, username="hookop", password="pw", operator=True)
    return user


def subscribe(user, url, event_types, **kw):
    from webhooks.services import subscription_create

    row, secret = subscription_create(user=user, url=url, event_types=list(event_types), **kw)
    return row, secret


def completed_delivery(load_agent, submit):
    """The default agent's run, driven to its end in-process, and the one
    delivery its terminal transition wrote: (run, delivery)."""
    from runs.runtime.executor import run_drive
    from webhooks.models import Delivery

    load_agent()
    run = submit()
    run_drive(run_id=run.id)
    (delivery,) = Delivery.objects.filter(run_id=run.id)
    return run, delivery


def approver_agent(load_agent, post_url="http://127.0.0.1:9/pay"):
    return load_agent(
        name="payer",
        tools=["http_post"],
        policy=APPROVER,
        turns=[
            {"tool_calls": [{"name": "http_post", "arguments": {"url": post_url, "json": {"amount": 500}}}]},
            {"text": "paid"},
        ],
    )
