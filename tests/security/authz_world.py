"""Shared pieces of the authorization tests (tests/security/test_authz_*.py):
two tenants, users in each role, a release-bot that posts to a local sink,
and a real daphne for the attacks replayed over HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest

from tests.conftest import ROOT, start_daphne, subprocess_env

SIDE_EFFECTS_NEED_APPROVAL = {
    "default": "allow",
    "rules": [{"tool": "*", "side_effect": True, "decision": "require_approval"}],
}


def release_bot(url: str, policy: dict | None = None) -> dict:
    """demo/release-bot.json, posting to `url`."""
    definition = json.loads((ROOT / "demo" / "release-bot.json").read_text())
    definition["model"]["turns"][0]["tool_calls"][0]["arguments"]["url"] = url
    if policy is not None:
        definition["policy"] = policy
    return definition


def allow_everything(url: str) -> dict:
    """The attacker's republish: release-bot with `policy.default: allow` and no rules."""
    return release_bot(url, {"default": "allow"})


def user(tenant_name: str, username: str, *, operator: bool = False, superuser: bool = False, perms=()):
    from django.contrib.auth.models import Permission

    from runs.services import tenant_create

    _, u = tenant_create(name=tenant_name, username=username, password="pw", operator=operator, superuser=superuser)
    if perms:
        u.user_permissions.add(*Permission.objects.filter(codename__in=perms))
    return type(u).objects.get(pk=u.pk)


def token_header(u) -> str:
    """`Token <key>` for `u`, made the way the API tests make theirs."""
    from tests.api.conftest import token_client

    return token_client(u)._credentials["HTTP_AUTHORIZATION"]


def http(base: str, method: str, path: str, *, auth: str | None = None, body=None) -> tuple[int, dict]:
    """One JSON request to the live server: (status, body)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        base + path,
        data=data,
        method=method,
        headers={"Content-Type": "application/json", **({"Authorization": auth} if auth else {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


@pytest.fixture
def live_server_url(transactional_db, sink, tmp_path):
    """A real daphne on this test database."""
    env = subprocess_env(AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host, DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost")
    log = open(tmp_path / "daphne.log", "wb")
    port, proc = start_daphne(env, log)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


@pytest.fixture
def two_tenants(db, sink):
    """acme and globex, each with release-bot waiting for approval, users in each role."""
    from approvals.models import Approval
    from runs.runtime.executor import run_drive
    from runs.services import agent_load, run_submit, tenant_get

    member = user("acme", "alice")
    publisher = user("acme", "pub", perms=("publish_agent",))
    operator = user("acme", "op", operator=True)
    root = user("acme", "root", superuser=True)
    bob = user("globex", "bob", operator=True, perms=("publish_agent",))
    acme, globex = tenant_get(name="acme"), tenant_get(name="globex")
    worlds = {}
    for tenant in (acme, globex):
        agent_load(tenant=tenant, definition=release_bot(sink.url))
        agent_load(
            tenant=tenant,
            definition={
                "name": "asker",
                "instructions": "ask",
                "tools": ["ask_user"],
                "model": {
                    "provider": "scripted",
                    "turns": [
                        {"tool_calls": [{"name": "ask_user", "arguments": {"question": "Which?"}}]},
                        {"text": "ok"},
                    ],
                },
            },
        )
        waiting, _ = run_submit(tenant=tenant, agent="release-bot", input="ship")
        run_drive(run_id=waiting.id)
        asking, _ = run_submit(tenant=tenant, agent="asker", input="go")
        run_drive(run_id=asking.id)
        worlds[tenant.name] = SimpleNamespace(
            tenant=tenant, waiting=waiting, asking=asking, approval=Approval.objects.get(run=waiting, status="pending")
        )
    return SimpleNamespace(
        acme=worlds["acme"],
        globex=worlds["globex"],
        member=member,
        publisher=publisher,
        operator=operator,
        root=root,
        bob=bob,
    )
