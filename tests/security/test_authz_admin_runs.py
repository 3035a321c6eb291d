"""Issue 10 item 4: the admin's cancel and resume need `runs.cancel_run` /
`runs.resume_run` and a confirmation page. A view-only staff user once
cancelled a run by posting the action; now the post changes nothing."""

from __future__ import annotations

import pytest
from django.test import Client

from runs.models import Run
from tests.security.authz_world import two_tenants, user  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def logged_in(u) -> Client:
    client = Client()
    client.force_login(u)
    return client


def state(run):
    return Run.objects.filter(id=run.id).values_list("status", "cancel_requested_at", "lease_epoch").get()


def act(client, action, run, confirm=True):
    data = {"action": action, "_selected_action": [str(run.id)]}
    if confirm:
        data["confirm"] = "yes"
    return client.post("/admin/runs/run/", data)


def test_a_view_only_staff_user_cannot_cancel_or_resume_through_the_admin(two_tenants):
    viewer = user("acme", "viewer", perms=("view_run",))
    viewer.is_staff = True
    viewer.save()
    client = logged_in(viewer)
    run = two_tenants.acme.waiting
    page = client.get("/admin/runs/run/")
    assert page.status_code == 200 and str(run.id)[:8] in page.content.decode()
    assert "cancel_runs" not in page.content.decode() and "resume_runs" not in page.content.decode()
    before = state(run)
    act(client, "cancel_runs", run)
    act(client, "resume_runs", run)
    assert state(run) == before == ("WAITING_FOR_APPROVAL", None, before[2])


def test_an_operator_cancels_after_a_confirmation_page(two_tenants):
    client = logged_in(two_tenants.operator)
    run = two_tenants.acme.waiting
    assert "cancel_runs" in client.get("/admin/runs/run/").content.decode()
    page = act(client, "cancel_runs", run, confirm=False)
    assert page.status_code == 200 and "Yes, cancel" in page.content.decode() and str(run.id) in page.content.decode()
    assert state(run)[0] == "WAITING_FOR_APPROVAL"  # nothing happens before the confirmation
    done = act(client, "cancel_runs", run)
    assert done.status_code == 302
    assert state(run)[0] == "CANCELLED"


def test_cancel_and_resume_permissions_are_separate(two_tenants):
    resumer = user("acme", "resumer", perms=("view_run", "resume_run"))
    resumer.is_staff = True
    resumer.save()
    client = logged_in(resumer)
    page = client.get("/admin/runs/run/").content.decode()
    assert "resume_runs" in page and "cancel_runs" not in page
    act(client, "cancel_runs", two_tenants.acme.asking)
    assert state(two_tenants.acme.asking)[0] == "WAITING_FOR_USER"
