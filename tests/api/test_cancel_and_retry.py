"""The cancel request's record and the retry's rules on every surface (issue
38 items 1 and 5): REST, the live page, the admin action and the service the
command line calls. Runs are driven in this process (run_drive); the real
qcluster cases are tests/e2e/test_cancel_recorded.py and test_retry.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from runs.clock import CLOCK
from runs.models import Event, Run
from runs.runtime.executor import run_drive
from runs.services import agent_load, run_submit
from runs.services.lifecycle import CANCEL_REASON_MAX, run_cancel, run_retry
from tests.api.test_routes import assert_error

pytestmark = pytest.mark.django_db(transaction=True)

TRANSIENT = {"name": "flaky", "model": {"provider": "scripted", "turns": [{"error": "transient"}]}}
PERMANENT = {"name": "refused", "model": {"provider": "scripted", "turns": [{"error": "permanent"}]}}


def failed_run(tenant, definition=TRANSIENT) -> Run:
    agent_load(tenant=tenant, definition={"instructions": "x", "tools": [], **definition})
    run, _ = run_submit(tenant=tenant, agent=definition["name"], input="hello")
    run_drive(run_id=run.id)
    return Run.objects.select_related("agent").get(id=run.id)


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


# -- retry ------------------------------------------------------------------------------------------


def test_only_a_transient_failure_is_retried_and_a_refusal_names_the_reason(tenant, alice, as_user):
    refused = failed_run(tenant, PERMANENT)
    assert refused.failure["reason"] == "model_permanent_error"
    client = as_user(alice)
    body = client.get(f"/api/runs/{refused.id}/").json()
    assert body["retryable"] is False
    error = assert_error(client.post(f"/api/runs/{refused.id}/retry/"), 409, "run_not_retryable")
    assert "model_permanent_error" in error["message"]
    assert Run.objects.get(id=refused.id).status == "FAILED" and payloads(refused, "run.retried") == []

    flaky = failed_run(tenant)
    assert flaky.failure["reason"] == "dependency_unavailable"
    assert client.get(f"/api/runs/{flaky.id}/").json()["retryable"] is True
    answer = client.post(f"/api/runs/{flaky.id}/retry/")
    assert answer.status_code == 202 and answer.json()["status"] == "QUEUED" and answer.json()["failure"] is None
    (retried,) = payloads(flaky, "run.retried")
    assert (retried["by"], retried["via"], retried["failure"]["reason"]) == ("alice", "api", "dependency_unavailable")


def test_a_run_that_did_not_fail_is_409_and_another_tenants_run_is_404(world, other_world, alice, as_user):
    client = as_user(alice)
    for run in (world.done, world.queued, world.waiting):
        assert_error(client.post(f"/api/runs/{run.id}/retry/"), 409, "run_not_failed")
    assert_error(client.post(f"/api/runs/{other_world.done.id}/retry/"), 404, "not_found")


def test_a_child_run_or_one_past_its_deadline_is_not_retried(tenant, alice, as_user):
    client = as_user(alice)
    late = failed_run(tenant)
    Run.objects.filter(id=late.id).update(deadline_at=CLOCK.now() - timedelta(seconds=1))
    error = assert_error(client.post(f"/api/runs/{late.id}/retry/"), 409, "run_not_retryable")
    assert "deadline" in error["message"]
    child = failed_run(tenant)
    Run.objects.filter(id=child.id).update(parent_id=late.id)
    error = assert_error(client.post(f"/api/runs/{child.id}/retry/"), 409, "run_not_retryable")
    assert "child run" in error["message"]


def test_a_retried_run_continues_in_process_and_the_live_page_and_admin_can_retry(tenant, alice, operator_user):
    page = Client()
    page.force_login(alice)
    run = failed_run(tenant)
    assert page.post(f"/runs/{run.id}/retry/").status_code == 302
    assert Run.objects.get(id=run.id).status == "QUEUED"
    assert payloads(run, "run.retried")[0]["via"] == "live"
    run_drive(run_id=run.id)  # the scripted model fails again: a new failure, retried once more by the admin
    assert Run.objects.get(id=run.id).status == "FAILED"

    admin = Client()
    admin.force_login(operator_user)
    form = {"action": "retry_runs", "_selected_action": [str(run.id)]}
    assert admin.post("/admin/runs/run/", form).status_code == 200  # the confirmation page
    admin.post("/admin/runs/run/", {**form, "confirm": "yes"})
    assert Run.objects.get(id=run.id).status == "QUEUED"
    assert [p["via"] for p in payloads(run, "run.retried")] == ["live", "admin"]


def test_the_cli_service_retries_and_refuses_like_the_api(tenant):
    from runs.errors import RunNotFailed

    run = failed_run(tenant)
    assert run_retry(run=run, by="ops", via="cli") == "QUEUED"
    with pytest.raises(RunNotFailed):
        run_retry(run=run, by="ops", via="cli")
    assert payloads(run, "run.retried")[0]["via"] == "cli"


@pytest.mark.parametrize("folded", [True, False], ids=["folded", "not folded yet"])
def test_a_retried_runs_figures_stay_counted_once(tenant, folded):
    from ops import fleet
    from runs.services.inputs import run_input

    asks = {"tool_calls": [{"name": "ask_user", "arguments": {"question": "Which region?"}}]}
    definition = {"name": "asker", "model": {"provider": "scripted", "turns": [asks, {"error": "transient"}]}}
    agent_load(tenant=tenant, definition={"instructions": "x", "tools": ["ask_user"], **definition})
    run, _ = run_submit(tenant=tenant, agent="asker", input="hello")
    run_drive(run_id=run.id)
    run_input(run=Run.objects.get(id=run.id), text="eu-west", by="alice")  # a counted event: run.requeued input
    run_drive(run_id=run.id)
    run = Run.objects.get(id=run.id)
    assert run.failure["reason"] == "dependency_unavailable"
    before = fleet.deployment_counters()
    assert before["requeued"]["input"] == 1 and before["run_steps"]["failed"].count == 1
    if folded:
        assert fleet.fold(batch=100, settled_seconds=0) >= 1
        assert fleet.deployment_counters() == before  # folding changes no figure
    assert run_retry(run=run, by="ops", via="cli") == "QUEUED"
    after = fleet.deployment_counters()
    # Its events are counted once (from the live run now), its failed end stays one observation.
    assert after["requeued"]["input"] == 1 and after["waiting"]["user"].count == before["waiting"]["user"].count
    assert after["run_steps"]["failed"].count == 1
    assert after["requeued"]["resume"] == before["requeued"]["resume"] + 1  # the retry's own run.requeued
    run_drive(run_id=run.id)  # the scripted model fails again
    fleet.fold(batch=100, settled_seconds=0)
    again = fleet.deployment_counters()
    assert again["run_steps"]["failed"].count == 2  # two ends, each counted once
    assert again["requeued"] == after["requeued"]
