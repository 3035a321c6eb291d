"""The IDOR matrix (RELIABILITY §5): every route under /api/, enumerated from
the URL resolver, × {anonymous, another tenant, staff without
approvals.resolve_approval, the owning tenant}. Nothing leaks: another
tenant's object is 404 and stays unchanged, anonymous is 401, a member
without the permission cannot decide, lists and filters show only the
caller's tenant, and a create lands in the caller's own tenant. The same
holds on the live pages and the WebSockets (all scoped by runs.services.scoping),
and a superuser views another tenant's run but acts on it nowhere (404)."""

from __future__ import annotations

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from approvals.models import Approval
from runs.models import AgentVersion, Event, Run
from webhooks.models import Delivery, WebhookSubscription

pytestmark = pytest.mark.django_db(transaction=True)

NOT_ROUTES = {"not-found"}  # the catch-all that answers 404 for every other path
DOCS = {"schema", "docs", "redoc"}


def api_routes() -> list[tuple[str, str, str]]:
    """(name, path template, method) for every route mounted under /api/."""
    found = []
    for entry in get_resolver().url_patterns:
        if isinstance(entry, URLResolver) and str(entry.pattern) == "api/":
            for sub in entry.url_patterns:
                assert isinstance(sub, URLPattern)
                if sub.name in NOT_ROUTES:
                    continue
                cls = getattr(sub.callback, "cls", None) or getattr(sub.callback, "view_class", None)
                template = "/api/" + str(sub.pattern).replace("<str:id>", "{id}").replace("<str:other>", "{other}")
                for method in ("get", "post", "put", "patch", "delete"):
                    if hasattr(cls, method):
                        found.append((sub.name, template, method.upper()))
    return found


# What each route acts on in the owning tenant, and a body that would succeed there.
TARGETS = {
    "agent-list": (None, lambda w: {"name": "intruder", "model": {"provider": "scripted", "turns": []}, "tools": []}),
    "run-list": (None, lambda w: {"agent": "bot", "input": "x"}),
    "run-detail": ("done", None),
    "run-events": ("done", None),
    "run-cancel": ("queued", lambda w: {}),
    "run-resume": ("queued", lambda w: {}),
    "run-retry": ("queued", lambda w: {}),
    "run-input": ("asking", lambda w: {"text": "eu-west"}),
    "run-fork": ("done", lambda w: {"from_step": 1}),
    "run-replay": ("done", lambda w: {}),
    "run-compare": ("done", None),  # against the tenant's queued run (`other`)
    "run-compare-bare": ("done", None),
    "approval-list": (None, None),
    "approval-detail": ("approval", None),
    "approval-approve": ("approval", lambda w: {"request_hash": w.approval.request_hash}),
    "approval-reject": ("approval", lambda w: {"request_hash": w.approval.request_hash}),
    "approval-confirm": ("approval", lambda w: {"request_hash": w.approval.request_hash, "took_effect": True}),
    "webhook-list": (None, lambda w: {"url": "http://127.0.0.1:9/hook", "event_types": ["run.completed"]}),
    "webhook-detail": ("subscription", lambda w: {"active": False}),
    "webhook-test": ("subscription", lambda w: {}),
    "webhook-deliveries": ("subscription", None),
    "schema": (None, None),
    "docs": (None, None),
    "redoc": (None, None),
}
DECISIONS = {"approval-approve", "approval-reject", "approval-confirm"}
ROUTES = api_routes()


def test_every_api_route_is_in_the_matrix():
    assert {name for name, _, _ in ROUTES} == set(TARGETS)
    # 13 operations of DESIGN §16 + confirm (§17) + schema, docs, redoc
    # + webhooks (list, create, get, change, delete, test, deliveries)
    # + fork, replay, compare (§18; compare with and without the trailing slash) + retry (issue 38)
    assert len(ROUTES) == 29


def snapshot(tenant):
    return (
        sorted(Run.objects.filter(tenant=tenant).values_list("id", "status", "cancel_requested_at", "lease_epoch")),
        sorted(Approval.objects.filter(tenant=tenant).values_list("id", "status", "decided_by_id")),
        Event.objects.filter(tenant=tenant).count(),
        sorted(AgentVersion.objects.filter(tenant=tenant).values_list("id", flat=True)),
        sorted(
            WebhookSubscription.objects.filter(tenant=tenant).values_list(
                "id", "url", "active", "event_types", "secret_encrypted"
            )
        ),
        sorted(Delivery.objects.filter(tenant=tenant).values_list("id", "status", "attempts")),
    )


def owned_ids(world) -> list[str]:
    ids = [str(r.id) for r in Run.objects.filter(tenant=world.tenant)]
    ids += [str(r.session_id) for r in Run.objects.filter(tenant=world.tenant)]
    ids += [str(a.id) for a in Approval.objects.filter(tenant=world.tenant)]
    ids += [str(v.id) for v in AgentVersion.objects.filter(tenant=world.tenant)]
    ids += [a.request_hash for a in Approval.objects.filter(tenant=world.tenant)]
    ids += [str(i) for i in WebhookSubscription.objects.filter(tenant=world.tenant).values_list("id", flat=True)]
    ids += [str(i) for i in Delivery.objects.filter(tenant=world.tenant).values_list("id", flat=True)]
    return ids


def call(client, method, path, body):
    if method == "GET":
        return client.get(path)
    return client.generic(
        method, path, "" if body is None else __import__("json").dumps(body), content_type="application/json"
    )


@pytest.mark.parametrize("name, template, method", ROUTES, ids=[f"{m} {t}" for _, t, m in ROUTES])
def test_idor_matrix(world, other_world, alice, operator, bob, as_user, anon, name, template, method):
    attr, make_body = TARGETS[name]
    target = getattr(world, attr) if attr else None
    path = template.format(id=target.id, other=world.queued.id) if target is not None else template
    body = make_body(world) if make_body else None
    secret = owned_ids(world)

    # anonymous: 401 before anything is looked up
    before = snapshot(world.tenant)
    response = call(anon, method, path, body)
    assert response.status_code == 401, (name, response.content)
    assert response.json()["code"] == "not_authenticated"
    assert snapshot(world.tenant) == before

    # another tenant's operator (who holds the permission in its own tenant)
    response = call(as_user(bob), method, path, body)
    text = response.content.decode()
    if target is not None:
        assert response.status_code == 404, (name, response.content)
        assert response.json()["code"] == "not_found"
    elif name in DOCS:
        assert response.status_code == 200
    elif method == "GET":
        assert response.status_code == 200
        assert not any(s in text for s in secret), f"{name} leaks tenant acme's ids to globex"
    else:  # a create lands in the caller's own tenant
        assert response.status_code == 201, response.content
        created = response.json()["id"]
        model = {"agent-list": AgentVersion, "webhook-list": WebhookSubscription}.get(name, Run)
        assert model.objects.get(id=created).tenant_id == other_world.tenant.id
    assert snapshot(world.tenant) == before, f"{method} {path} by another tenant changed acme's objects"

    # a member without approvals.resolve_approval
    if name in DECISIONS:
        response = call(as_user(alice), method, path, body)
        assert response.status_code == 403 and response.json()["code"] == "permission_denied"
        assert snapshot(world.tenant) == before
        assert Approval.objects.get(id=world.approval.id).status == "pending"
    elif method == "GET":
        assert call(as_user(alice), method, path, body).status_code == 200

    # the owning tenant: the route works (or answers the state's conflict)
    response = call(as_user(operator), method, path, body)
    assert response.status_code < 300 or response.status_code == 409, (name, response.content)
    if target is not None and method == "GET" and name not in DOCS:
        assert str(target.id) in response.content.decode()


def test_filters_cannot_reach_another_tenants_objects(world, other_world, bob, as_user):
    client = as_user(bob)
    assert client.get("/api/runs/", {"session": str(world.done.session_id)}).json()["count"] == 0
    assert client.get("/api/runs/", {"parent": str(world.delegating.id)}).json()["count"] == 0
    own_children = client.get("/api/runs/", {"parent": str(other_world.delegating.id)}).json()
    assert [r["id"] for r in own_children["results"]] == [str(other_world.child.id)]
    foreign = client.get(f"/api/runs/{other_world.delegating.id}/").json()["children"]
    assert [c["id"] for c in foreign] == [str(other_world.child.id)]  # a run's children are its own tenant's
    assert client.get("/api/approvals/", {"run": str(world.waiting.id)}).json()["count"] == 0
    assert client.get("/api/agents/", {"name": "bot"}).json()["count"] == 1  # globex's own "bot"
    own = {r["id"] for r in client.get("/api/runs/", {"page_size": 200}).json()["results"]}
    assert own == {str(r.id) for r in Run.objects.filter(tenant=other_world.tenant)}
    response = client.post(
        "/api/runs/", {"agent": "bot", "input": "x", "session": str(world.done.session_id)}, format="json"
    )
    assert response.status_code == 400 and response.json()["fields"]["session"] == ["unknown session"]


# -- the live pages and the WebSockets (through runs.services.scoping, like the API) -------------


def page_snapshot(world):
    return snapshot(world.tenant), Approval.objects.get(id=world.approval.id).status


def browser(user=None):
    from django.test import Client

    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def live_routes(world):
    """(method, path, data) of every live page route, aimed at `world`'s objects."""
    return [
        ("GET", f"/runs/{world.waiting.id}/", None),
        ("POST", f"/runs/{world.waiting.id}/cancel/", {}),
        (
            "POST",
            f"/runs/{world.waiting.id}/decide/",
            {"approval": str(world.approval.id), "decision": "approve", "request_hash": world.approval.request_hash},
        ),
        ("POST", f"/runs/{world.done.id}/fork/", {"from_step": "0"}),
        ("POST", f"/runs/{world.done.id}/replay/", {}),
    ]


def send_page(client, method, path, data):
    return client.get(path) if method == "GET" else client.post(path, data)


def test_live_pages_idor_matrix(world, other_world, alice, operator, bob):
    secret = owned_ids(world)
    before = page_snapshot(world)
    for method, path, data in live_routes(world):
        response = send_page(browser(), method, path, data)
        assert response.status_code == 302 and "/login/" in response["Location"], (path, response.status_code)
        assert send_page(browser(bob), method, path, data).status_code == 404, path  # another tenant's operator
        assert page_snapshot(world) == before, f"{method} {path} by another tenant changed acme's objects"
    listing = browser(bob).get("/runs/").content.decode()
    assert not any(s in listing for s in secret), "the live list leaks acme's runs to globex"
    # a member without approvals.resolve_approval cannot decide from the page
    browser(alice).post(live_routes(world)[2][1], live_routes(world)[2][2])
    assert Approval.objects.get(id=world.approval.id).status == "pending"
    # the owning tenant's operator decides
    assert browser(operator).post(live_routes(world)[2][1], live_routes(world)[2][2]).status_code == 302
    assert Approval.objects.get(id=world.approval.id).status == "approved"


def test_a_superuser_views_another_tenants_run_everywhere_but_acts_on_it_nowhere(world, other_world, root, as_user):
    api, page = as_user(root), browser(root)
    target = other_world
    before = page_snapshot(target)
    assert api.get(f"/api/runs/{target.waiting.id}/").status_code == 200
    assert page.get(f"/runs/{target.waiting.id}/").status_code == 200
    assert str(target.waiting.id) in page.get("/runs/").content.decode()
    for path, body in [
        (f"/api/runs/{target.queued.id}/cancel/", {}),
        (f"/api/runs/{target.queued.id}/resume/", {}),
        (f"/api/runs/{target.asking.id}/input/", {"text": "x"}),
        (f"/api/runs/{target.done.id}/fork/", {"from_step": 0}),
        (f"/api/runs/{target.done.id}/replay/", {}),
        (f"/api/approvals/{target.approval.id}/approve/", {"request_hash": target.approval.request_hash}),
        (f"/api/approvals/{target.approval.id}/reject/", {"request_hash": target.approval.request_hash}),
    ]:
        response = api.post(path, body, format="json")
        assert response.status_code == 404 and response.json()["code"] == "not_found", path
    for _method, path, data in live_routes(target)[1:]:
        assert page.post(path, data).status_code == 404, path
    assert page_snapshot(target) == before


ORIGIN = (b"origin", b"http://localhost")
HOST = (b"host", b"localhost")  # the origin check compares the Origin with the server's own (Host)


def _cookie(user):
    client = browser(user)
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


async def _ws(path, user=None):
    from asgiref.sync import sync_to_async
    from channels.testing import WebsocketCommunicator

    from agentrt_site.asgi import application

    headers = [HOST, ORIGIN] + ([await sync_to_async(_cookie)(user)] if user is not None else [])
    comm = WebsocketCommunicator(application, path, headers=headers)
    ok, _ = await comm.connect(timeout=5)
    return comm, ok


@pytest.mark.asyncio
async def test_websockets_idor_matrix(world, other_world, alice, bob, root, stranger):
    from asgiref.sync import sync_to_async

    from runs.services.lifecycle import run_cancel

    path = f"/ws/runs/{world.done.id}/"
    for who in (None, bob, stranger):  # anonymous, another tenant, no tenant: closed before any frame
        comm, ok = await _ws(path, who)
        assert not ok
    for who in (None, stranger):
        comm, ok = await _ws("/ws/runs/", who)
        assert not ok
    comm, ok = await _ws(path, alice)  # the owning tenant's member streams it
    assert ok and (await comm.receive_json_from(timeout=5))["type"] == "run.created"
    await comm.disconnect()
    comm, ok = await _ws(f"/ws/runs/{other_world.done.id}/", root)  # a superuser may watch any tenant's run
    assert ok and (await comm.receive_json_from(timeout=5))["run"] == str(other_world.done.id)
    await comm.disconnect()

    # the tenant stream carries only the caller's tenant
    owner, ok_owner = await _ws("/ws/runs/", alice)
    outsider, ok_outsider = await _ws("/ws/runs/", bob)
    assert ok_owner and ok_outsider
    await sync_to_async(run_cancel)(run=world.queued, by="alice")
    frame = await owner.receive_json_from(timeout=5)
    assert frame["type"] == "run.cancelled" and frame["run"] == str(world.queued.id)
    assert await outsider.receive_nothing(timeout=1.0)
    await owner.disconnect()
    await outsider.disconnect()


@pytest.mark.asyncio
async def test_a_demoted_superuser_stops_watching_another_tenants_run(world, other_world, root):
    """Watching a foreign tenant's run rests on being a superuser, not on the
    membership in one's own tenant: losing the flag closes the socket."""
    from asgiref.sync import sync_to_async
    from django.contrib.auth import get_user_model

    own, ok_own = await _ws(f"/ws/runs/{world.done.id}/", root)
    foreign, ok_foreign = await _ws(f"/ws/runs/{other_world.done.id}/", root)
    assert ok_own and ok_foreign
    await sync_to_async(lambda: get_user_model().objects.filter(pk=root.pk).update(is_superuser=False))()

    async def close_code(comm):
        while True:
            message = await comm.receive_output(timeout=3)
            if message["type"] == "websocket.close":
                return message.get("code")

    assert await close_code(foreign) == 4401
    while (await own.receive_output(timeout=3))["type"] == "websocket.send":
        if await own.receive_nothing(timeout=1.0):
            break  # its own tenant's run: still a member, the socket stays open
    await own.disconnect()


def test_confirm_on_another_tenants_approval_is_404_for_a_superuser_whatever_the_body(other_world, root, as_user):
    """confirm answers like approve/reject: the acting scope is checked before
    the body, so a superuser learns nothing from a 400 about a foreign approval."""
    api = as_user(root)
    for body in ({}, {"request_hash": other_world.approval.request_hash, "took_effect": "maybe"}):
        response = api.post(f"/api/approvals/{other_world.approval.id}/confirm/", body, format="json")
        assert response.status_code == 404 and response.json()["code"] == "not_found", body
