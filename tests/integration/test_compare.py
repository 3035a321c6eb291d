"""Compare (issue 37 item 4): two runs side by side, step by step, over REST
and on the page; where they diverge."""

from __future__ import annotations

import pytest
from django.test import Client

from runs.models import Run
from runs.runtime.executor import run_drive
from runs.services.compare import run_compare
from runs.services.lineage import run_fork, run_replay
from tests.api.conftest import token_client

pytestmark = pytest.mark.django_db(transaction=True)


def post(sink, n):
    return {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"effect": n}}}]}


def drive(run):
    run_drive(run_id=run.id)
    return Run.objects.select_related("agent").get(id=run.id)


@pytest.fixture
def original(load_agent, submit, sink):
    turns = [post(sink, 1), post(sink, 2), {"text": "paid", "usage": {"input_tokens": 30, "output_tokens": 4}}]
    load_agent(name="payer", turns=turns, tools=("http_post",))
    return drive(submit(agent="payer", text="pay"))


def test_a_replay_that_repeats_the_original_is_the_same_at_every_step(original):
    replay = drive(run_replay(run=original))
    compared = run_compare(a=original, b=replay)
    assert compared["diverged_at"] is None
    assert [s["step"] for s in compared["steps"]] == [1, 2, 3]
    assert all(s["same"] and s["same_text"] for s in compared["steps"])
    step2 = compared["steps"][1]
    assert step2["a"]["calls"][0]["arguments"]["json"] == {"effect": 2}
    assert step2["a"]["calls"][0]["replayed"] is False and step2["b"]["calls"][0]["replayed"] is True
    assert compared["steps"][2]["a"]["text"] == "paid"
    assert (
        compared["steps"][2]["a"]["usage"]["input_tokens"] == 30 and compared["steps"][2]["a"]["usage"]["attempts"] == 1
    )
    assert compared["b"]["replay_of"] == str(original.id)


def test_a_diverged_replay_diverges_at_its_step(original, load_agent, sink):
    changed = load_agent(name="payer", turns=[post(sink, 1), post(sink, 9), {"text": "paid"}], tools=("http_post",))
    replay = drive(run_replay(run=original, agent_version=changed.version))
    compared = run_compare(a=original, b=replay)
    assert compared["diverged_at"] == 2
    assert compared["steps"][0]["same"] and not compared["steps"][1]["same"]
    assert compared["steps"][1]["b"]["calls"][0]["result"]["error"] == "replay_diverged"
    assert compared["steps"][2]["b"] is None  # the replay ended at step 2
    assert compared["b"]["failure"]["details"]["reason"] == "different_call"


def test_a_forks_steps_before_its_fork_point_are_the_originals(original, operator):
    fork = drive(run_fork(run=original, from_step=2, principal=operator))
    compared = run_compare(a=original, b=fork)
    steps = {s["step"]: s for s in compared["steps"]}
    assert steps[1]["b"]["inherited"] and steps[2]["b"]["inherited"] and not steps[3]["b"]["inherited"]
    assert steps[1]["b"]["run"] == str(original.id) and steps[3]["b"]["run"] == str(fork.id)
    assert compared["diverged_at"] is None


def test_rest_and_the_page_compare_two_runs_of_the_callers_tenant_only(original, tenant):
    from django.contrib.auth import get_user_model

    from runs.services import tenant_create

    replay = drive(run_replay(run=original))
    alice = get_user_model().objects.get(username="alice")
    client = token_client(alice)
    for path in (f"/api/runs/{original.id}/compare/{replay.id}/", f"/api/runs/{original.id}/compare/{replay.id}"):
        response = client.get(path)
        assert response.status_code == 200, response.content
        assert response.json()["diverged_at"] is None and len(response.json()["steps"]) == 3
    _, bob = tenant_create(name="globex", username="bob", password="pw")
    assert token_client(bob).get(f"/api/runs/{original.id}/compare/{replay.id}/").status_code == 404
    page = Client()
    page.force_login(alice)
    html = page.get(f"/runs/{original.id}/compare/{replay.id}/")
    assert html.status_code == 200
    assert b"same at every step" in html.content and b"http_post" in html.content
    stranger = Client()
    stranger.force_login(bob)
    assert stranger.get(f"/runs/{original.id}/compare/{replay.id}/").status_code == 404
