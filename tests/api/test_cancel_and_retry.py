"""The cancel request's record on every surface (issue 38 item 1): REST, the
live page, the admin action and the service the command line calls. Runs are
driven in this process (run_drive); the real qcluster cases are
tests/e2e/test_cancel_recorded.py."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from runs.models import Event, Run
from runs.services.lifecycle import CANCEL_REASON_MAX, run_cancel
from tests.api.test_routes import assert_error

pytestmark = pytest.mark.django_db(transaction=True)


def payloads(run, type_: str) -> list[dict]:
    return list(Event.objects.filter(run_id=run.id, type=type_).order_by("sequence").values_list("payload", flat=True))


# -- cancel -----------------------------------------------------------------------------------------


def test_a_cancel_is_recorded_with_who_via_and_the_scrubbed_reason_before_the_run_ends(world, alice, as_user):
    response = as_user(alice).post(
        f"/api/runs/{world.queued.id}/cancel/",
        {"reason": "  duplicate of ticket 42, token sk-abcdef0123456789abcdef  "},
        format="json",
    )
    assert response.status_code == 202 and response.json()["status"] == "CANCELLED"
    (requested,) = payloads(world.queued, "run.cancel_requested")
    assert requested["by"] == "alice" and requested["via"] == "api"
    assert (
        requested["reason"].startswith("duplicate of ticket 42")
        and "sk-abcdef0123456789abcdef" not in requested["reason"]
    )
    (cancelled,) = payloads(world.queued, "run.cancelled")
    assert (cancelled["by"], cancelled["via"], cancelled["reason"], cancelled["direct"]) == (
        "alice",
        "api",
        requested["reason"],
        True,
    )
    types = list(Event.objects.filter(run_id=world.queued.id).order_by("sequence").values_list("type", flat=True))
    assert types.index("run.cancel_requested") == types.index("run.cancelled") - 1


@pytest.mark.parametrize("reason", [42, ["why"], {"a": 1}, "x" * (CANCEL_REASON_MAX + 1)])
def test_a_reason_that_is_not_text_or_too_long_is_400_naming_it_and_nothing_is_recorded(world, alice, as_user, reason):
    response = as_user(alice).post(f"/api/runs/{world.queued.id}/cancel/", {"reason": reason}, format="json")
    body = assert_error(response, 400, "invalid")
    assert "reason" in body["fields"]
    assert Run.objects.get(id=world.queued.id).status == "QUEUED"
    assert payloads(world.queued, "run.cancel_requested") == []


def test_the_service_checks_the_reason_too_for_the_command_line(world):
    from runs.errors import InvalidInput

    with pytest.raises(InvalidInput) as refused:
        run_cancel(run=world.queued, by="ops", via="cli", reason="x" * (CANCEL_REASON_MAX + 1))
    assert "reason" in refused.value.fields
    assert run_cancel(run=world.queued, by="ops", via="cli", reason="maintenance window") == "CANCELLED"
    (requested,) = payloads(world.queued, "run.cancel_requested")
    assert requested == {"by": "ops", "via": "cli", "reason": "maintenance window"}


def test_a_cancel_of_a_running_run_is_recorded_and_a_second_one_too(world, alice, as_user):
    Run.objects.filter(id=world.queued.id).update(status="RUNNING", lease_owner="w:1:x", lease_epoch=1)
    client = as_user(alice)
    for reason in ("first", None):
        assert client.post(f"/api/runs/{world.queued.id}/cancel/", {"reason": reason}, format="json").status_code == 202
    assert [p["reason"] for p in payloads(world.queued, "run.cancel_requested")] == ["first", None]
    assert payloads(world.queued, "run.cancelled") == []  # its worker ends it, at its next observation point


def test_a_finished_run_is_409_and_no_request_is_recorded(world, alice, as_user):
    response = as_user(alice).post(f"/api/runs/{world.done.id}/cancel/", {"reason": "late"}, format="json")
    assert_error(response, 409, "run_terminal")
    assert payloads(world.done, "run.cancel_requested") == []


def test_the_live_page_and_the_admin_record_their_surface_and_reason(world, alice, operator_user):
    page = Client()
    page.force_login(alice)
    answer = page.post(f"/runs/{world.queued.id}/cancel/", {"reason": "from the page"})
    assert answer.status_code == 302
    assert payloads(world.queued, "run.cancel_requested")[0] == {
        "by": "alice",
        "via": "live",
        "reason": "from the page",
    }

    admin = Client()
    admin.force_login(operator_user)
    changelist = "/admin/runs/run/"
    form = {"action": "cancel_runs", "_selected_action": [str(world.asking.id)]}
    confirm = admin.post(changelist, form)
    assert confirm.status_code == 200 and b'name="reason"' in confirm.content  # the confirmation asks why
    admin.post(changelist, {**form, "confirm": "yes", "reason": "from the admin"})
    assert payloads(world.asking, "run.cancel_requested") == [{"by": "op", "via": "admin", "reason": "from the admin"}]
    assert Run.objects.get(id=world.asking.id).status == "CANCELLED"


@pytest.fixture
def operator_user(tenant):
    from runs.services import tenant_create

    _, user = tenant_create(name=tenant.name, username="op", password="pw", operator=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["cancel_run", "resume_run"]))
    return type(user).objects.get(pk=user.pk)
