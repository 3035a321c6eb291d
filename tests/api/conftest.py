"""Fixtures of the REST API tests: two tenants with the same kinds of objects
(queued, finished, waiting-for-approval and waiting-for-user runs, a pending
approval), users in each role, and token-authenticated clients."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

APPROVE_POSTS = {
    "default": "allow",
    "rules": [
        {"tool": "http_post", "decision": "require_approval", "when": {"arg": "json.amount", "op": "gt", "value": 100}}
    ],
}
HOOK = "http://127.0.0.1:9/hook"  # never called: the policy suspends before the call


def agent_definitions():
    return [
        {
            "name": "bot",
            "instructions": "say done",
            "model": {"provider": "scripted", "turns": [{"text": "done"}]},
            "tools": ["echo"],
        },
        {
            "name": "approver",
            "instructions": "pay",
            "tools": ["http_post"],
            "policy": APPROVE_POSTS,
            "model": {
                "provider": "scripted",
                "turns": [
                    {"tool_calls": [{"name": "http_post", "arguments": {"url": HOOK, "json": {"amount": 500}}}]},
                    {"text": "paid"},
                ],
            },
        },
        {
            "name": "lead",
            "instructions": "delegate",
            "tools": ["delegate_run"],
            "delegates": ["bot"],
            "model": {
                "provider": "scripted",
                "turns": [
                    {"tool_calls": [{"name": "delegate_run", "arguments": {"agent": "bot", "input": "help"}}]},
                    {"text": "delegated"},
                ],
            },
        },
        {
            "name": "asker",
            "instructions": "ask",
            "tools": ["ask_user"],
            "model": {
                "provider": "scripted",
                "turns": [
                    {"tool_calls": [{"name": "ask_user", "arguments": {"question": "Which region?"}}]},
                    {"text": "deploying"},
                ],
            },
        },
    ]


def make_world(tenant) -> SimpleNamespace:
    """One tenant's objects, made through the services (no status written here)."""
    from approvals.models import Approval
    from runs.models import Run
    from runs.runtime.executor import run_drive
    from runs.services import agent_load, run_submit

    for definition in agent_definitions():
        agent_load(tenant=tenant, definition=definition)

    def submit(agent, drive=False):
        run, _ = run_submit(tenant=tenant, agent=agent, input="hello")
        if drive:
            run_drive(run_id=run.id)
        return Run.objects.select_related("agent").get(id=run.id)

    queued = submit("bot")
    done = submit("bot", drive=True)
    waiting = submit("approver", drive=True)
    asking = submit("asker", drive=True)
    delegating = submit("lead", drive=True)  # waits for its child, which is queued (nothing drives it here)
    child = Run.objects.select_related("agent").get(parent=delegating)
    assert (queued.status, done.status, waiting.status, asking.status, delegating.status, child.status) == (
        "QUEUED",
        "COMPLETED",
        "WAITING_FOR_APPROVAL",
        "WAITING_FOR_USER",
        "WAITING_FOR_APPROVAL",
        "QUEUED",
    )
    approval = Approval.objects.get(run=waiting)
    subscription, delivery = webhook_world(tenant, done)
    return SimpleNamespace(
        tenant=tenant,
        queued=queued,
        done=done,
        waiting=waiting,
        asking=asking,
        delegating=delegating,
        child=child,
        approval=approval,
        subscription=subscription,
        delivery=delivery,
    )


WEBHOOK_URL = "http://127.0.0.1:9/hook"  # AGENTRT_WEBHOOK_ALLOWED_HOSTS below; nothing listens (no cluster runs here)


def webhook_world(tenant, run):
    """A subscription of `tenant` and one delivery to it (rows written here: the services need a user)."""
    from webhooks.models import Delivery, WebhookSubscription
    from webhooks.secrets import encrypt, new_secret

    sub = WebhookSubscription.objects.create(
        tenant=tenant, url=WEBHOOK_URL, event_types=["run.completed"], secret_encrypted=encrypt(new_secret())
    )
    delivery = Delivery.objects.create(
        tenant=tenant,
        run=run,
        kind="webhook",
        subscription=sub,
        event_type="run.completed",
        payload={"id": "x", "type": "run.completed", "data": {"run": {"id": str(run.id)}}},
    )
    return sub, delivery


def grant_resolve(user):
    from django.contrib.auth.models import Permission

    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["resolve_approval", "publish_agent", "manage_webhooks"])
    )
    return type(user).objects.get(pk=user.pk)


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    # The users here log in with tokens; PBKDF2's cost would dominate the suite's time.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _webhook_hosts(settings):
    settings.AGENTRT_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1:9"]


@pytest.fixture(autouse=True)
def _fresh_throttle_cache():
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def other_tenant(db):
    from runs.services import tenant_create

    tenant, _ = tenant_create(name="globex", username="bob", password="pw")
    return tenant


@pytest.fixture
def alice(tenant):
    """Plain member of acme (not staff, no permissions)."""
    from django.contrib.auth import get_user_model

    return get_user_model().objects.get(username="alice")


@pytest.fixture
def bob(other_tenant):
    """Operator of globex, with approvals.resolve_approval and runs.publish_agent."""
    from django.contrib.auth import get_user_model

    return grant_resolve(get_user_model().objects.get(username="bob"))


@pytest.fixture
def root(tenant):
    """A superuser who is a member of acme."""
    from runs.services import tenant_create

    _, user = tenant_create(name=tenant.name, username="root", password="pw", superuser=True)
    return user


@pytest.fixture
def stranger(db):
    """An authenticated user who belongs to no tenant."""
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user(username="stranger", password="pw")


@pytest.fixture
def world(tenant):
    return make_world(tenant)


@pytest.fixture
def other_world(other_tenant):
    return make_world(other_tenant)


def token_client(user=None):
    from knox.models import AuthToken
    from rest_framework.test import APIClient

    client = APIClient()
    if user is not None:
        _, token = AuthToken.objects.create(user=user)
        client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


@pytest.fixture
def as_user():
    return token_client


@pytest.fixture
def anon():
    return token_client(None)
