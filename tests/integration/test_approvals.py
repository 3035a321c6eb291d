"""Policy approvals: a whole batch suspends, the run holds nothing while it
waits, and resumes once, on the same step, when the last call is decided."""

from __future__ import annotations

import pytest
from django.db import connection

from approvals.errors import ApprovalExpired, ApprovalStale
from approvals.models import Approval
from approvals.services import approval_decide
from checkpoints.repository import checkpoint_latest
from runs.models import Event, Run, ToolInvocation
from runs.runtime.executor import run_drive
from runs.tools import REGISTRY

pytestmark = pytest.mark.django_db(transaction=True)

APPROVE_POSTS = {
    "default": "allow",
    "rules": [
        {"tool": "http_post", "decision": "require_approval", "when": {"arg": "json.amount", "op": "gt", "value": 100}}
    ],
}


def reload(run):
    return Run.objects.get(id=run.id)


def types(run):
    return list(Event.objects.filter(run=run).order_by("sequence").values_list("type", flat=True))


def batch_agent(load_agent, sink, amount=250):
    load_agent(
        turns=[
            {
                "tool_calls": [
                    {"name": "echo", "arguments": {"text": "before"}},
                    {"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": amount}}},
                ]
            },
            {"text": "done"},
        ],
        tools=("echo", "http_post"),
        policy=APPROVE_POSTS,
    )


def test_one_call_needing_approval_suspends_the_whole_batch(load_agent, submit, sink):
    batch_agent(load_agent, sink)
    run = submit()
    outcome = run_drive(run_id=run.id)
    assert outcome.kind.value == "suspended"
    row = reload(run)
    assert row.status == "WAITING_FOR_APPROVAL" and row.lease_owner is None and row.lease_expires_at is None
    statuses = dict(ToolInvocation.objects.filter(run=run).values_list("tool_name", "status"))
    assert statuses == {"echo": "authorized", "http_post": "awaiting_approval"}  # neither ran
    assert sink.count() == 0
    approval = Approval.objects.get(run=run)
    assert approval.kind == "policy" and approval.status == "pending" and len(approval.request_hash) == 64
    assert approval.presentation["arguments"]["json"]["amount"] == 250
    assert approval.expires_at is not None and approval.expires_at <= row.deadline_at
    seen = types(run)
    assert seen[-3:] == ["approval.requested", "run.checkpointed", "run.waiting_for_approval"]
    cp = checkpoint_latest(run.id)
    assert cp is not None and cp.version >= 2
    # The waiting run is invisible to a doorbell and to the reclaim sweep.
    assert run_drive(run_id=run.id) is None
    from maintenance.sweeps.reclaim import sweep_reclaim

    assert sweep_reclaim()["expired"] == 0
    assert reload(run).status == "WAITING_FOR_APPROVAL"


def test_approving_runs_the_batch_once_on_the_same_step(load_agent, submit, sink, operator):
    batch_agent(load_agent, sink)
    run = submit()
    run_drive(run_id=run.id)
    approval = Approval.objects.get(run=run)
    approval_decide(
        user=operator,
        approval_id=approval.id,
        approve=True,
        request_hash=approval.request_hash,
        reason="ok",
        via="live",
    )
    assert reload(run).status == "QUEUED"
    run_drive(run_id=run.id)
    row = reload(run)
    assert row.status == "COMPLETED" and row.final_message == "done"
    assert sink.count() == 1
    statuses = dict(ToolInvocation.objects.filter(run=run).values_list("tool_name", "status"))
    assert statuses == {"echo": "completed", "http_post": "completed"}
    assert Event.objects.filter(run=run, type="tool.call.proposed").count() == 2  # no second proposal
    assert Event.objects.get(run=run, type="approval.resolved").payload["decided_via"] == "live"
    assert row.step_count == 2


def test_rejecting_gives_the_model_a_denied_result_and_the_run_goes_on(load_agent, submit, sink, operator):
    batch_agent(load_agent, sink)
    run = submit()
    run_drive(run_id=run.id)
    approval = Approval.objects.get(run=run)
    approval_decide(
        user=operator, approval_id=approval.id, approve=False, request_hash=approval.request_hash, via="api"
    )
    run_drive(run_id=run.id)
    row = reload(run)
    assert row.status == "COMPLETED" and sink.count() == 0
    post = ToolInvocation.objects.get(run=run, tool_name="http_post")
    assert post.status == "failed" and post.result["error"] == "rejected_by_operator" and post.effect_sent_at is None
    tool_msgs = [m for m in checkpoint_latest(run.id).conversation if m["role"] == "tool"]
    assert any("rejected_by_operator" in m["content"] for m in tool_msgs)


def test_a_tool_whose_schema_changed_invalidates_the_approval_and_asks_again(
    load_agent, submit, sink, operator, monkeypatch
):
    batch_agent(load_agent, sink)
    run = submit()
    run_drive(run_id=run.id)
    approval = Approval.objects.get(run=run)
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash)
    spec = REGISTRY.spec("http_post")
    changed = spec.model_copy(update={"schema_version": "2"})
    entry = REGISTRY._tools["http_post"]
    monkeypatch.setitem(REGISTRY._tools, "http_post", (changed, entry[1], entry[2]))
    run_drive(run_id=run.id)
    assert reload(run).status == "WAITING_FOR_APPROVAL"
    assert sink.count() == 0
    assert "approval.invalidated" in types(run)
    fresh = Approval.objects.filter(run=run, status="pending").get()
    assert fresh.id != approval.id and fresh.request_hash != approval.request_hash
    assert Approval.objects.get(id=approval.id).status == "invalidated"


def test_a_stale_hash_changes_nothing_and_an_expired_approval_cannot_be_decided(load_agent, submit, sink, operator):
    batch_agent(load_agent, sink)
    run = submit()
    run_drive(run_id=run.id)
    approval = Approval.objects.get(run=run)
    with pytest.raises(ApprovalStale):
        approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash[::-1])
    assert Approval.objects.get(id=approval.id).status == "pending" and reload(run).status == "WAITING_FOR_APPROVAL"
    with connection.cursor() as cur:
        cur.execute("UPDATE approvals SET expires_at = now() - interval '1 second' WHERE id = %s", [approval.id])
    with pytest.raises(ApprovalExpired):
        approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash)
    assert Approval.objects.get(id=approval.id).status == "pending"


def test_a_run_that_keeps_asking_for_denied_calls_fails_repeated_denial(load_agent, submit):
    load_agent(
        turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "nope"}}]}],
        policy={"default": "deny"},
        limits={"max_steps": 10},
    )
    run = submit()
    run_drive(run_id=run.id)
    row = reload(run)
    assert row.status == "FAILED" and row.failure["reason"] == "repeated_denial"
    assert row.step_count == 3


def test_the_reaper_expires_approvals_and_fails_the_run(load_agent, submit, sink):
    from maintenance.sweeps.expiry import sweep_expiry

    batch_agent(load_agent, sink)
    run = submit()
    run_drive(run_id=run.id)
    approval = Approval.objects.get(run=run)
    assert sweep_expiry()["approval_expired"] == 0
    with connection.cursor() as cur:
        cur.execute("UPDATE approvals SET expires_at = now() - interval '1 second' WHERE id = %s", [approval.id])
    assert sweep_expiry()["approval_expired"] == 1
    row = reload(run)
    assert row.status == "FAILED" and row.failure["reason"] == "approval_expired"
    assert Approval.objects.get(id=approval.id).status == "expired"
    assert sink.count() == 0


def test_a_waiting_run_past_its_deadline_fails_deadline_exceeded(load_agent, submit, sink):
    from maintenance.sweeps.expiry import sweep_expiry

    batch_agent(load_agent, sink)
    run = submit()
    run_drive(run_id=run.id)
    with connection.cursor() as cur:
        cur.execute("UPDATE runs SET deadline_at = now() - interval '1 second' WHERE id = %s", [run.id])
    assert sweep_expiry()["deadline_exceeded"] == 1
    assert reload(run).failure["reason"] == "deadline_exceeded"
    assert Approval.objects.get(run=run).status == "cancelled"


def test_cancelling_a_waiting_run_ends_it_and_calls_nothing(load_agent, submit, sink):
    from runs.services.lifecycle import run_cancel

    batch_agent(load_agent, sink)
    run = submit()
    run_drive(run_id=run.id)
    assert run_cancel(run=reload(run)) == "CANCELLED"
    assert reload(run).status == "CANCELLED" and Approval.objects.get(run=run).status == "cancelled"
    assert run_drive(run_id=run.id) is None and sink.count() == 0


def test_ask_user_waits_for_input_and_text_to_the_session_is_routed_to_it(load_agent, submit, tenant):
    from runs.services import run_submit
    from runs.services.inputs import RunNotWaitingForUser, run_input

    load_agent(
        turns=[
            {"tool_calls": [{"name": "ask_user", "arguments": {"question": "Which region?"}}]},
            {"text": "deploying"},
        ],
        tools=("ask_user",),
    )
    run = submit()
    run_drive(run_id=run.id)
    row = reload(run)
    assert row.status == "WAITING_FOR_USER" and row.lease_owner is None
    waiting = Event.objects.get(run=run, type="run.waiting_for_user")
    assert waiting.payload["question"] == "Which region?"
    routed, created = run_submit(tenant=tenant, agent="bot", input="eu-west", session=row.session_id)
    assert not created and routed.id == run.id and getattr(routed, "routed", False)
    assert reload(run).status == "QUEUED"
    with pytest.raises(RunNotWaitingForUser):
        run_input(run=reload(run), text="again")
    run_drive(run_id=run.id)
    row = reload(run)
    assert row.status == "COMPLETED" and row.final_message == "deploying"
    answer = ToolInvocation.objects.get(run=run)
    assert answer.status == "completed" and answer.result == {"answer": "eu-west"}
    assert Event.objects.get(run=run, type="run.input_received").payload["text"] == "eu-west"


def test_a_question_nobody_answers_fails_input_deadline_exceeded(load_agent, submit, settings):
    from maintenance.sweeps.expiry import sweep_expiry

    load_agent(
        turns=[{"tool_calls": [{"name": "ask_user", "arguments": {"question": "?"}}]}, {"text": "x"}],
        tools=("ask_user",),
    )
    run = submit()
    run_drive(run_id=run.id)
    assert sweep_expiry()["input_deadline_exceeded"] == 0
    settings.AGENTRT_INPUT_TTL_SECONDS = 0
    assert sweep_expiry()["input_deadline_exceeded"] == 1
    assert reload(run).failure["reason"] == "input_deadline_exceeded"


def test_prune_keeps_only_the_final_snapshot_of_a_terminal_run(load_agent, submit):
    from checkpoints.models import Checkpoint
    from maintenance.sweeps.prune import sweep_prune

    load_agent(
        turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": str(i)}}]} for i in range(4)] + [{"text": "end"}]
    )
    run = submit()
    run_drive(run_id=run.id)
    before = Checkpoint.objects.filter(run=run).count()
    assert before > 2
    result = sweep_prune()
    left = list(Checkpoint.objects.filter(run=run).values_list("version", "full", "trigger"))
    assert result["deleted"] == before - 1 and len(left) == 1 and left[0][1] and left[0][2] == "final"
    assert checkpoint_latest(run.id).conversation[-1]["content"] == "end"


def test_prune_deletes_in_one_statement_and_keeps_the_chain_of_a_run_whose_last_version_is_not_full(load_agent, submit):
    from django.test.utils import CaptureQueriesContext

    from checkpoints.models import Checkpoint
    from maintenance.sweeps.prune import _prune_run

    load_agent(turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]}, {"text": "end"}])
    kept, pruned = submit(text="kept"), submit(text="pruned")
    run_drive(run_id=kept.id)
    run_drive(run_id=pruned.id)
    top = Checkpoint.objects.filter(run=kept).order_by("-version").first()
    Checkpoint.objects.create(
        tenant_id=kept.tenant_id, run=kept, version=top.version + 1, full=False, trigger="step", state={}
    )
    chain, before = Checkpoint.objects.filter(run=kept).count(), Checkpoint.objects.filter(run=pruned).count()
    with CaptureQueriesContext(connection) as queries:
        assert _prune_run(kept.id) == 0
        assert _prune_run(pruned.id) == before - 1
    assert Checkpoint.objects.filter(run=kept).count() == chain  # its last version is not a full snapshot
    assert list(Checkpoint.objects.filter(run=pruned).values_list("trigger", flat=True)) == ["final"]
    # Django wraps each delete in BEGIN/COMMIT; between them, only the one DELETE
    statements = [q["sql"] for q in queries.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]
    assert len(statements) == 2 and all(sql.startswith("DELETE") for sql in statements), statements


def test_the_sweep_rings_again_for_a_queued_run_whose_doorbell_a_dead_worker_took(load_agent, submit):
    from datetime import timedelta

    from django.conf import settings
    from django_q.models import OrmQ

    from maintenance.sweeps.reclaim import sweep_reclaim

    load_agent()
    run = submit()
    assert OrmQ.objects.count() == 1
    with connection.cursor() as cur:
        cur.execute("UPDATE runs SET updated_at = now() - interval '10 seconds' WHERE id = %s", [run.id])
    # Waiting in the queue: a doorbell that will be delivered; nothing to do.
    assert sweep_reclaim()["requeued_doorbells"] == 0
    # A worker took it 10 s ago and died with it: django-q2 would hand it out
    # again only after `retry`. The sweep rings again.
    from runs.runtime.queue import db_now

    taken = db_now() - timedelta(seconds=10)
    OrmQ.objects.update(lock=taken + timedelta(seconds=settings.Q_CLUSTER["retry"]))
    lost = OrmQ.objects.get().id
    assert sweep_reclaim()["requeued_doorbells"] == 1
    # The lost doorbell is replaced, not added to (it would come back after `retry` for nothing).
    assert OrmQ.objects.count() == 1 and OrmQ.objects.get().id != lost
