"""The Idempotency-Key rules of `POST /api/runs/` (DESIGN §16): same key and
same body → 200 with the original run; same key and another body → 409
`idempotency_key_reused`; keys are per tenant; a refused request reserves
nothing."""

from __future__ import annotations

import pytest

from runs.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

BODY = {"agent": "bot", "input": "deploy", "limits": {"max_steps": 4}}


def post(client, body, key):
    return client.post("/api/runs/", body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_a_replay_answers_200_with_the_original_run_even_after_it_ended(world, alice, as_user):
    client = as_user(alice)
    first = post(client, BODY, "deploy-1")
    assert first.status_code == 201
    run_id = first.json()["id"]
    from runs.services.lifecycle import run_cancel

    run_cancel(run=Run.objects.get(id=run_id))
    replay = post(client, BODY, "deploy-1")
    assert replay.status_code == 200
    assert replay.json()["id"] == run_id and replay.json()["status"] == "CANCELLED"
    assert Run.objects.filter(idempotency_key="deploy-1").count() == 1


def test_key_order_of_the_json_body_does_not_matter(world, alice, as_user):
    client = as_user(alice)
    first = post(client, BODY, "k")
    reordered = post(client, {"limits": {"max_steps": 4}, "input": "deploy", "agent": "bot"}, "k")
    assert reordered.status_code == 200 and reordered.json()["id"] == first.json()["id"]


@pytest.mark.parametrize(
    "change",
    [
        {"input": "deploy!"},
        {"limits": {"max_steps": 5}},
        {"limits": None},
        {"agent": "asker"},
    ],
)
def test_the_same_key_with_another_body_is_409(world, alice, as_user, change):
    client = as_user(alice)
    assert post(client, BODY, "k").status_code == 201
    response = post(client, {**BODY, **change}, "k")
    assert response.status_code == 409 and response.json()["code"] == "idempotency_key_reused"
    assert Run.objects.filter(tenant=world.tenant, idempotency_key="k").count() == 1


def test_the_same_key_with_another_session_is_409(world, alice, as_user):
    client = as_user(alice)
    assert post(client, BODY, "k").status_code == 201
    response = post(client, {**BODY, "session": str(world.done.session_id)}, "k")
    assert response.status_code == 409 and response.json()["code"] == "idempotency_key_reused"


def test_keys_belong_to_a_tenant(world, other_world, alice, bob, as_user):
    mine = post(as_user(alice), BODY, "shared-key")
    theirs = post(as_user(bob), BODY, "shared-key")
    assert mine.status_code == theirs.status_code == 201
    assert mine.json()["id"] != theirs.json()["id"]
    assert Run.objects.get(id=theirs.json()["id"]).tenant_id == other_world.tenant.id


def test_a_refused_request_reserves_nothing(world, alice, as_user):
    client = as_user(alice)
    assert post(client, {**BODY, "agent": "ghost"}, "k").status_code == 400
    assert post(client, {**BODY, "limits": {"max_steps": "4"}}, "k").status_code == 400
    assert post(client, BODY, "k").status_code == 201


@pytest.mark.parametrize("key", ["", "   ", "x" * 201, "a\x00b"])
def test_an_invalid_key_is_400_naming_the_header(world, alice, as_user, key):
    response = post(as_user(alice), BODY, key)
    assert response.status_code == 400 and "Idempotency-Key" in response.json()["fields"]


def test_without_a_key_every_post_creates_a_run(world, alice, as_user):
    client = as_user(alice)
    ids = {client.post("/api/runs/", BODY, format="json").json()["id"] for _ in range(3)}
    assert len(ids) == 3
