"""The run page's lineage (issue 37 item 5): where a run came from, its forks
and replays with links to compare them, the forms that fork and replay it,
"Fork from here" drawn by the page's script; and the compare page, which
escapes every text a model, a tool or a user wrote."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from runs.models import Run
from runs.runtime.executor import run_drive
from runs.services import tenant_create

pytestmark = pytest.mark.django_db(transaction=True)
HOSTILE = "<img src=x onerror=window.__pwned=1>"


def page_for(username):
    client = Client()
    client.force_login(get_user_model().objects.get(username=username))
    return client


@pytest.fixture
def done(load_agent, submit):
    turns = [{"tool_calls": [{"name": "echo", "arguments": {"text": HOSTILE}}]}, {"text": f"said {HOSTILE}"}]
    load_agent(name="talker", turns=turns, tools=("echo",))
    run = submit(agent="talker", text=f"say {HOSTILE}")
    run_drive(run_id=run.id)
    return Run.objects.get(id=run.id)


def test_the_run_page_forks_from_a_step_and_shows_the_lineage(done):
    page = page_for("alice")
    html = page.get(f"/runs/{done.id}/").content.decode()
    assert 'id="lineage"' in html and 'id="fork-form"' in html and 'id="replay-form"' in html
    assert "No forks or replays yet." in html

    response = page.post(f"/runs/{done.id}/fork/", {"from_step": "1"})
    fork = Run.objects.get(forked_from_id=done.id)
    assert response.status_code == 302 and response["Location"] == f"/runs/{fork.id}/"
    assert fork.forked_from_step == 1 and fork.fork_effects == "approve"
    assert fork.principal_user_id == get_user_model().objects.get(username="alice").pk

    original = page.get(f"/runs/{done.id}/").content.decode()
    assert f"/runs/{fork.id}/" in original and f"/runs/{done.id}/compare/{fork.id}/" in original
    forked = page.get(f"/runs/{fork.id}/").content.decode()
    assert "forked at step 1 from" in forked and f"/runs/{done.id}/compare/{fork.id}/" in forked

    replayed = page.post(f"/runs/{done.id}/replay/", {})
    replay = Run.objects.get(replay_of_id=done.id)
    assert replayed["Location"] == f"/runs/{replay.id}/"
    run_drive(run_id=replay.id)
    assert Run.objects.get(id=replay.id).status == "COMPLETED"
    assert "replays" in page.get(f"/runs/{replay.id}/").content.decode()


def test_a_refused_fork_says_why_and_creates_nothing(done):
    page = page_for("alice")
    response = page.post(f"/runs/{done.id}/fork/", {"from_step": "9"}, follow=True)
    assert b"from_step must be from 0 to 2" in response.content
    response = page.post(f"/runs/{done.id}/fork/", {"from_step": "1", "effects": "policy"}, follow=True)
    assert b"needs the runs.publish_agent permission" in response.content  # alice may not publish
    assert not Run.objects.filter(forked_from_id=done.id).exists()


def test_the_compare_page_escapes_what_models_tools_and_users_wrote(done):
    page = page_for("alice")
    page.post(f"/runs/{done.id}/replay/", {})
    replay = Run.objects.get(replay_of_id=done.id)
    run_drive(run_id=replay.id)
    html = page.get(f"/runs/{done.id}/compare/{replay.id}/").content.decode()
    assert HOSTILE not in html and "&lt;img src=x onerror=window.__pwned=1&gt;" in html
    assert "same at every step" in html and "replayed" in html
    run_page = page.get(f"/runs/{done.id}/").content.decode()
    assert HOSTILE not in run_page


def test_another_tenant_neither_sees_nor_forks_nor_compares(done):
    tenant_create(name="globex", username="bob", password="pw")
    page = page_for("bob")
    page_for("alice").post(f"/runs/{done.id}/replay/", {})
    replay_id = Run.objects.get(replay_of_id=done.id).id
    assert page.post(f"/runs/{done.id}/fork/", {"from_step": "1"}).status_code == 404
    assert page.post(f"/runs/{done.id}/replay/", {}).status_code == 404
    assert page.get(f"/runs/{done.id}/compare/{replay_id}/").status_code == 404
    assert Run.objects.filter(forked_from_id=done.id).count() == 0
    assert Run.objects.filter(replay_of_id=done.id).count() == 1


def test_the_admin_links_a_run_to_its_lineage_and_the_compare_page(done, operator):
    from runs.services.lineage import run_fork

    fork = run_fork(run=done, from_step=1, principal=operator)
    admin = Client()
    admin.force_login(operator)
    original = admin.get(f"/admin/runs/run/{done.id}/change/").content.decode()
    assert f"/admin/runs/run/{fork.id}/change/" in original and f"/runs/{done.id}/compare/{fork.id}/" in original
    forked = admin.get(f"/admin/runs/run/{fork.id}/change/").content.decode()
    assert "forked from" in forked and f"/admin/runs/run/{done.id}/change/" in forked
