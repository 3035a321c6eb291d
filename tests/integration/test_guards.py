"""The loop's remaining guards (issue 15 §2) on PostgreSQL: the principal and
its revalidation, damaged records at resume, agent version pinning, the
breaker and the deadline reserve through the real store, and maintenance
resilience (the prune pass, the worker's backoff). Each section's first test
was first written against the code before the change and showed today's
behaviour (commit "Tests that reproduce today's behaviour ..."): an approved
call ran for a deactivated submitter, a damaged model-call row did not stop
resume, a missing pinned version crashed the drive task and stranded the run
RUNNING, one failing run aborted the prune pass, the worker retried a failing
queue at a fixed 0.5 s."""

from __future__ import annotations

import logging
import sys
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from approvals.models import Approval
from approvals.services import approval_decide
from checkpoints.models import Checkpoint
from runs.models import Agent, AgentVersion, Membership, ModelCall, Run, ToolInvocation
from runs.runtime.executor import run_drive
from runs.runtime.resume import run_resume
from runs.services.inputs import run_input
from runs.tools import REGISTRY
from tests.crash import die_at
from tests.unit.fakes import FakeClock

pytestmark = pytest.mark.django_db(transaction=True)

APPROVE_POSTS = {"default": "allow", "rules": [{"tool": "http_post", "decision": "require_approval"}]}


def reload(run):
    return Run.objects.get(id=run.id)


def alice():
    return get_user_model().objects.get(username="alice")


@pytest.fixture
def whoami():
    import tests.tool_modules.whoami as module

    module.SEEN.clear()
    yield module.SEEN
    REGISTRY.unregister("whoami")
    sys.modules.pop("tests.tool_modules.whoami", None)


def post_agent(load_agent, sink, then=None, **kw):
    turns = [{"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"n": 1}}}]}]
    return load_agent(turns=turns + (then or [{"text": "ok"}]), tools=("http_post", "echo"), policy=APPROVE_POSTS, **kw)


def approve(run, operator):
    approval = Approval.objects.get(run=run, status="pending")
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash)


# -- principal and scope ------------------------------------------------------------------------------------


def test_the_principal_and_its_scopes_are_stamped_at_submission_and_given_to_tools(
    load_agent, submit, operator, whoami
):
    load_agent(turns=[{"tool_calls": [{"name": "whoami", "arguments": {}}]}, {"text": "ok"}], tools=("whoami",))
    run = submit(principal=operator)
    row = reload(run)
    assert row.principal_user_id == operator.pk
    assert row.principal_scopes == sorted(operator.get_all_permissions())
    assert {"runs.publish_agent", "approvals.resolve_approval"} <= set(row.principal_scopes)
    run_drive(run_id=run.id)
    assert reload(run).status == "COMPLETED"
    (seen,) = whoami
    assert (seen["kind"], seen["username"], seen["user_id"]) == ("user", "op", operator.pk)
    assert seen["scopes"] == row.principal_scopes


def test_a_run_submitted_by_the_system_acts_for_the_system(load_agent, submit, whoami):
    load_agent(turns=[{"tool_calls": [{"name": "whoami", "arguments": {}}]}, {"text": "ok"}], tools=("whoami",))
    run = submit()
    run_drive(run_id=run.id)
    assert reload(run).principal_user_id is None
    assert [(s["kind"], s["username"]) for s in whoami] == [("system", None)]


def test_the_rest_api_stamps_the_caller_as_the_principal(load_agent, tenant):
    from rest_framework.test import APIClient

    load_agent(turns=[{"text": "ok"}])
    client = APIClient()
    client.force_authenticate(alice())
    response = client.post("/api/runs/", {"agent": "bot", "input": "hi"}, format="json")
    assert response.status_code == 201, response.content
    assert Run.objects.get(id=response.json()["id"]).principal_user_id == alice().pk


REVOCATIONS = {
    "deactivated": lambda: get_user_model().objects.filter(username="alice").update(is_active=False),
    "removed_from_tenant": lambda: Membership.objects.filter(user__username="alice").delete(),
    "deleted": lambda: get_user_model().objects.filter(username="alice").delete(),
}


@pytest.mark.parametrize("revoke", sorted(REVOCATIONS))
def test_a_principal_revoked_while_waiting_for_approval_fails_the_run_before_any_tool_runs(
    revoke, load_agent, submit, sink, operator
):
    # Before the revalidation: the approved call ran and the run completed (sink count 1).
    post_agent(load_agent, sink)
    run = submit(principal=alice())
    run_drive(run_id=run.id)
    assert reload(run).status == "WAITING_FOR_APPROVAL"
    REVOCATIONS[revoke]()
    approve(run, operator)
    run_drive(run_id=run.id)
    row = reload(run)
    assert row.status == "FAILED" and row.failure["reason"] == "principal_revoked", row.failure
    assert row.failure["error_class"] == "PrincipalRevoked"
    assert sink.count() == 0
    assert ToolInvocation.objects.get(run=run).effect_sent_at is None


def test_a_principal_still_a_member_runs_the_approved_call(load_agent, submit, sink, operator):
    post_agent(load_agent, sink)
    run = submit(principal=alice())
    run_drive(run_id=run.id)
    approve(run, operator)
    run_drive(run_id=run.id)
    assert reload(run).status == "COMPLETED" and sink.count() == 1


def test_a_principal_revoked_while_waiting_for_input_fails_the_run_at_resumption(load_agent, submit, whoami):
    load_agent(
        turns=[
            {"tool_calls": [{"name": "ask_user", "arguments": {"question": "which?"}}]},
            {"tool_calls": [{"name": "whoami", "arguments": {}}]},
            {"text": "ok"},
        ],
        tools=("ask_user", "whoami"),
    )
    run = submit(principal=alice())
    run_drive(run_id=run.id)
    assert reload(run).status == "WAITING_FOR_USER"
    get_user_model().objects.filter(username="alice").update(is_active=False)
    run_input(run=reload(run), text="the blue one")
    run_drive(run_id=run.id)
    row = reload(run)
    assert row.status == "FAILED" and row.failure["reason"] == "principal_revoked"
    assert whoami == []


# -- the breaker and the deadline reserve through the store ------------------------------------------------


def test_a_looping_model_fails_tool_loop_detected_with_its_call_run_twice(load_agent, submit):
    load_agent(turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "again"}}]}], limits={"max_steps": 10})
    run = submit()
    run_drive(run_id=run.id)
    row = reload(run)
    assert row.status == "FAILED" and row.failure["reason"] == "tool_loop_detected"
    assert ToolInvocation.objects.filter(run=run).count() == 2 and row.step_count == 3
    last = ModelCall.objects.get(run=run, step_number=3)
    assert last.status == "failed" and last.error["error_class"] == "ToolLoopDetected"


def test_a_call_approved_before_the_deadline_runs_inside_the_reserve(load_agent, submit, sink, operator):
    post_agent(load_agent, sink, limits={"deadline_seconds": 300})
    run = submit()
    run_drive(run_id=run.id)
    approve(run, operator)
    # The run is now inside its reserve (the last 60 s of 300): the approved call is exempt.
    Run.objects.filter(id=run.id).update(deadline_at=Approval.objects.get(run=run).decided_at + timedelta(seconds=30))
    run_drive(run_id=run.id)
    row = reload(run)
    assert sink.count() == 1 and row.status == "COMPLETED" and row.final_message == "ok"
    assert ModelCall.objects.filter(run=run, step_number=2, error__isnull=True).exists()


def test_an_open_batch_resumed_inside_the_reserve_gets_budget_refusals(monkeypatch, load_agent, submit, sink):
    load_agent(
        turns=[{"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {}}}]}, {"text": "late"}],
        tools=("http_post",),
        limits={"deadline_seconds": 300},
    )
    run = submit()
    die_at(monkeypatch, run, "tool.before_watermark")  # the batch is decided and saved; its call never started
    with connection.cursor() as cur:  # now inside the reserve: 30 s before the deadline
        cur.execute("UPDATE runs SET deadline_at = now() + interval '30 seconds' WHERE id = %s", [run.id])
    assert run_resume(run_id=run.id) == "continue"
    run_drive(run_id=run.id)
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "failed" and inv.result["error"] == "tool.budget_exhausted"
    assert inv.result["dimension"] == "deadline" and inv.effect_sent_at is None and sink.count() == 0
    row = reload(run)
    assert row.status == "COMPLETED" and row.final_message == "late" and row.usage["tool_calls"] == 0


# -- damaged records ------------------------------------------------------------------------------------------


def test_a_damaged_model_call_row_fails_the_run_at_resume_without_rewriting_it(monkeypatch, load_agent, submit):
    # Before: resume continued from it ("continue").
    load_agent(turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]}, {"text": "done"}])
    run = submit()
    die_at(monkeypatch, run, "model.after_call")
    with connection.cursor() as cur:
        cur.execute("""UPDATE model_calls SET usage = '{"input_tokens": "lots"}' WHERE run_id = %s""", [run.id])
    assert run_resume(run_id=run.id) == "failed"
    row = reload(run)
    assert row.failure["reason"] == "internal_error" and row.failure["error_class"] == "DamagedRecord"
    assert row.failure["details"]["damaged"].startswith("model call ")
    assert ModelCall.objects.get(run=run).usage == {"input_tokens": "lots"}


@pytest.mark.parametrize(
    "damage",
    ["presentation = '\"shown\"'", "status = 'maybe'", "kind = 'whatever'", "request_hash = 'short'"],
)
def test_a_damaged_approval_row_fails_the_run_at_resume_without_rewriting_it(
    damage, monkeypatch, load_agent, submit, sink, operator
):
    post_agent(load_agent, sink, then=[{"tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]}, {"text": "ok"}])
    run = submit()
    run_drive(run_id=run.id)
    approve(run, operator)
    die_at(monkeypatch, run, "model.after_call")  # step 2, after the approved call ran
    with connection.cursor() as cur:
        cur.execute(f"UPDATE approvals SET {damage} WHERE run_id = %s", [run.id])
    assert run_resume(run_id=run.id) == "failed"
    row = reload(run)
    assert row.failure["error_class"] == "DamagedRecord"
    assert row.failure["details"]["damaged"].startswith("approval ")
    assert sink.count() == 1


# -- agent version pinning ------------------------------------------------------------------------------------


def test_an_agent_republished_mid_run_does_not_change_the_running_run(load_agent, submit, sink, operator):
    post_agent(load_agent, sink, then=[{"text": "answer of version one"}])
    run = submit()
    pinned = reload(run).agent_version
    run_drive(run_id=run.id)
    assert reload(run).status == "WAITING_FOR_APPROVAL"
    load_agent(turns=[{"text": "answer of version two"}], tools=("echo",), instructions="something else")
    assert Agent.objects.get(name="bot").latest_version != pinned
    approve(run, operator)
    run_drive(run_id=run.id)
    row = reload(run)
    assert (row.status, row.final_message, row.agent_version) == ("COMPLETED", "answer of version one", pinned)
    assert sink.count() == 1


def test_a_missing_pinned_version_fails_loudly_and_never_falls_back_to_latest(load_agent, submit, caplog):
    # Before: the drive task crashed (the supervisor's stop raised) and the run stayed RUNNING.
    load_agent(turns=[{"text": "from version one"}])
    run = submit()
    load_agent(turns=[{"text": "from the latest version"}])
    AgentVersion.objects.filter(agent_id=run.agent_id, version=run.agent_version).delete()
    with caplog.at_level(logging.ERROR, logger="agentrt.executor"):
        run_drive(run_id=run.id)
    row = reload(run)
    assert row.status == "FAILED" and row.failure["reason"] == "agent_version_missing"
    assert row.failure["error_class"] == "AgentVersionMissing" and row.final_message is None
    assert row.failure["details"]["agent_version"] == run.agent_version and row.lease_owner is None
    assert ModelCall.objects.filter(run=run).count() == 0
    assert any("does not fall back to latest" in r.getMessage() for r in caplog.records)


def test_a_missing_pinned_version_fails_a_resumed_run_too(monkeypatch, load_agent, submit):
    load_agent(turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]}, {"text": "done"}])
    run = submit()
    die_at(monkeypatch, run, "model.after_call")
    AgentVersion.objects.filter(agent_id=run.agent_id, version=run.agent_version).delete()
    assert run_resume(run_id=run.id) == "failed"
    assert reload(run).failure["reason"] == "agent_version_missing"


# -- maintenance ----------------------------------------------------------------------------------------------


@pytest.fixture
def refuse_checkpoint_deletes():
    """A real database failure for one run's checkpoint deletes (a trigger)."""

    def refuse(run_id):
        with connection.cursor() as cur:
            cur.execute(
                "CREATE OR REPLACE FUNCTION guards_refuse_delete() RETURNS trigger AS $$"
                " BEGIN RAISE EXCEPTION 'checkpoint delete refused'; END $$ LANGUAGE plpgsql"
            )
            cur.execute(
                "CREATE TRIGGER guards_refuse BEFORE DELETE ON checkpoints FOR EACH ROW"
                f" WHEN (OLD.run_id = '{run_id}') EXECUTE FUNCTION guards_refuse_delete()"
            )

    yield refuse
    with connection.cursor() as cur:
        cur.execute("DROP TRIGGER IF EXISTS guards_refuse ON checkpoints")
        cur.execute("DROP FUNCTION IF EXISTS guards_refuse_delete()")


def finished_runs(load_agent, submit, n=3):
    load_agent(
        turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": f"p{i}"}}]} for i in range(3)] + [{"text": "ok"}]
    )
    runs = []
    for i in range(n):
        run = submit(text=f"go {i}")
        run_drive(run_id=run.id)
        assert reload(run).status == "COMPLETED"
        runs.append(run)
    return runs


def test_one_run_failing_in_a_prune_pass_is_logged_and_the_pass_goes_on(
    load_agent, submit, refuse_checkpoint_deletes, caplog
):
    from maintenance.sweeps.prune import sweep_prune

    runs = finished_runs(load_agent, submit)
    bad = runs[1]
    refuse_checkpoint_deletes(bad.id)
    before = Checkpoint.objects.filter(run=bad).count()
    with caplog.at_level(logging.WARNING, logger="agentrt.maintenance"):
        result = sweep_prune()
    assert result["failed"] == 1 and result["deleted"] > 0
    for run in runs:
        left = Checkpoint.objects.filter(run=run).count()
        assert left == (before if run is bad else 1), run
    (record,) = [r for r in caplog.records if "prune" in r.getMessage()]
    assert str(bad.id) in record.getMessage() and "(ProgrammingError)" in record.getMessage()
    assert "refused" not in record.getMessage()  # the error class, never the exception's text


@pytest.fixture
def queue_table_gone():
    """The worker's queue cannot be read (its table renamed away), for real."""

    def gone():
        with connection.cursor() as cur:
            cur.execute("ALTER TABLE django_q_ormq RENAME TO django_q_ormq_away")

    def restore():
        with connection.cursor() as cur:
            cur.execute("ALTER TABLE IF EXISTS django_q_ormq_away RENAME TO django_q_ormq")

    gone()
    yield gone, restore
    restore()


def test_worker_queue_failures_back_off_up_to_30_s_and_a_success_resets_it(settings, queue_table_gone):
    # Before: a fixed 0.5 s between tries, however long the outage.
    from django_q.signing import SignedPackage

    from runs.runtime import doorbell

    gone, restore = queue_table_gone
    settings.AGENTRT_Q_DOORBELL = True
    clock = FakeClock()
    broker = doorbell.DoorbellORM(list_key="default")
    broker.clock = clock
    for _ in range(9):
        assert broker.dequeue() is None
    base = min(1.0, settings.AGENTRT_Q_FALLBACK_POLL)
    assert clock.sleeps[:5] == [base, base * 2, base * 4, base * 8, base * 16]
    assert all(b >= a for a, b in zip(clock.sleeps, clock.sleeps[1:], strict=False))
    assert clock.sleeps[-2:] == [30.0, 30.0]  # capped
    restore()
    broker.enqueue(SignedPackage.dumps({"id": "x", "name": "probe"}))
    assert broker.dequeue()  # the queue reads again: the allowance is reset
    gone()
    clock.sleeps.clear()
    assert broker.dequeue() is None and clock.sleeps == [base]


@pytest.fixture
def runs_table_gone():
    """Every sweep that reads runs fails for real: the table is renamed away."""

    def gone():
        with connection.cursor() as cur:
            cur.execute("ALTER TABLE runs RENAME TO runs_away")

    def restore():
        with connection.cursor() as cur:
            cur.execute("ALTER TABLE IF EXISTS runs_away RENAME TO runs")

    gone()
    yield restore
    restore()


def test_failing_maintenance_iterations_back_off_up_to_30_s_and_a_clean_one_resets(runs_table_gone):
    from maintenance.runner import cadences, run_forever

    tick = min(every for _, every, _ in cadences()) / 2  # an iteration's wait while all is well
    clock = FakeClock()
    run_forever(stop=lambda: len(clock.sleeps) >= 12, clock=clock)
    expected = [min(30.0, tick * 2**i) for i in range(12)]
    assert clock.sleeps == expected and expected[-1] == 30.0 and expected[0] == tick
    runs_table_gone()  # restored
    run_forever(stop=lambda: len(clock.sleeps) >= 14, clock=clock)
    assert clock.sleeps[12:] == [tick, tick]  # clean iterations wait the tick again
