"""The loop's remaining guards (issue 15 §2) on PostgreSQL: the principal
and its revalidation, damaged records at resume, agent version pinning,
and maintenance resilience (the prune pass, the worker's backoff)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from approvals.models import Approval
from approvals.services import approval_decide
from checkpoints.models import Checkpoint
from runs.models import AgentVersion, Run
from runs.runtime.executor import run_drive
from runs.runtime.resume import run_resume
from tests.crash import die_at
from tests.unit.fakes import FakeClock

pytestmark = pytest.mark.django_db(transaction=True)

APPROVE_POSTS = {"default": "allow", "rules": [{"tool": "http_post", "decision": "require_approval"}]}


def reload(run):
    return Run.objects.get(id=run.id)


def post_agent(load_agent, sink, **kw):
    return load_agent(
        turns=[
            {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"n": 1}}}]},
            {"text": "ok"},
        ],
        tools=("http_post",),
        policy=APPROVE_POSTS,
        **kw,
    )


# -- principal ----------------------------------------------------------------------------------------------


def test_today_a_deactivated_submitter_does_not_stop_the_approved_call(load_agent, submit, sink, operator):
    post_agent(load_agent, sink)
    run = submit()
    run_drive(run_id=run.id)
    assert reload(run).status == "WAITING_FOR_APPROVAL"
    get_user_model().objects.filter(username="alice").update(is_active=False)
    approval = Approval.objects.get(run=run)
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash)
    run_drive(run_id=run.id)
    assert reload(run).status == "COMPLETED" and sink.count() == 1


# -- damaged records ------------------------------------------------------------------------------------------


def test_today_a_damaged_model_call_row_does_not_stop_resume(monkeypatch, load_agent, submit):
    load_agent(turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]}, {"text": "done"}])
    run = submit()
    die_at(monkeypatch, run, "model.after_call")
    with connection.cursor() as cur:
        cur.execute("""UPDATE model_calls SET usage = '{"input_tokens": "lots"}' WHERE run_id = %s""", [run.id])
    assert run_resume(run_id=run.id) == "continue"


# -- agent version pinning ------------------------------------------------------------------------------------


def test_today_a_missing_pinned_version_crashes_the_task_and_strands_the_run(load_agent, submit):
    load_agent(turns=[{"text": "v1"}])
    run = submit()
    AgentVersion.objects.filter(agent_id=run.agent_id, version=run.agent_version).delete()
    # The context cannot be built; the supervisor was never started and its stop raises.
    with pytest.raises(RuntimeError, match="cannot join thread"):
        run_drive(run_id=run.id)
    assert reload(run).status == "RUNNING"


# -- maintenance --------------------------------------------------------------------------------------------


@pytest.fixture
def refuse_checkpoint_deletes():
    """A real database failure for one run's checkpoint deletes (a trigger)."""
    made = []

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
        made.append(run_id)

    yield refuse
    with connection.cursor() as cur:
        cur.execute("DROP TRIGGER IF EXISTS guards_refuse ON checkpoints")
        cur.execute("DROP FUNCTION IF EXISTS guards_refuse_delete()")


def finished_runs(load_agent, submit, n=2):
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


def test_today_one_failing_run_stops_the_prune_pass(load_agent, submit, refuse_checkpoint_deletes):
    from maintenance.sweeps.prune import sweep_prune

    bad, _good = finished_runs(load_agent, submit)
    refuse_checkpoint_deletes(bad.id)
    with pytest.raises(Exception, match="checkpoint delete refused"):
        sweep_prune()


@pytest.fixture
def queue_table_gone():
    """The worker's queue cannot be read (its table renamed away), for real."""
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE django_q_ormq RENAME TO django_q_ormq_away")

    def restore():
        with connection.cursor() as cur:
            cur.execute("ALTER TABLE IF EXISTS django_q_ormq_away RENAME TO django_q_ormq")

    yield restore
    restore()


def test_today_the_worker_retries_a_failing_queue_every_second(monkeypatch, settings, queue_table_gone):
    from runs.runtime import doorbell

    settings.AGENTRT_Q_DOORBELL = True
    clock = FakeClock()
    monkeypatch.setattr(doorbell, "CLOCK", clock)
    broker = doorbell.DoorbellORM(list_key="default")
    for _ in range(6):
        assert broker.dequeue() is None
    fixed = min(1.0, settings.AGENTRT_Q_FALLBACK_POLL)
    assert clock.sleeps == [fixed] * 6  # a fixed short delay, however long the outage lasts
