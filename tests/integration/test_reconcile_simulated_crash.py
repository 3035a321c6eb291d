"""Resume with a configured reconciler (seed 000 "With Config.Reconcile",
DESIGN §9 and §16 "Reconciler"), driven in-process: a worker "dies" at a
fault point (a BaseException nothing in the runtime catches), its lease is
made to expire, and Resume asks the reconciler named by
settings.AGENTRT_RECONCILER (callables in tests/integration/reconcilers.py).

The loopback sink is the ground truth for how often the side effect was sent.

These are SIMULATED crashes (a BaseException; `finally` blocks of the "dead"
worker still run): the same fault points with a real SIGKILL and a real
reconciler in the real resuming process are in tests/fault/test_kill_points.py."""

from __future__ import annotations

import json
import threading

import pytest

from approvals.models import Approval
from approvals.services import approval_decide
from checkpoints.repository import checkpoint_latest
from runs.models import Event, ModelCall, Run, ToolInvocation
from runs.runtime.executor import run_drive
from runs.runtime.resume import RunView, run_resume
from runs.tools import REGISTRY
from tests.crash import die_at  # noqa: E402
from tests.integration import reconcilers as R

pytestmark = pytest.mark.django_db(transaction=True)

PATH = "tests.integration.reconcilers."


def shown(presentation, sink):
    """A reconcile approval's presentation: the reconciler's keys and, always, what runs."""
    return {
        **presentation,
        "tool": "http_post",
        "arguments": {"url": sink.url, "json": {"amount": 5}},
        "side_effect": "external_write",
    }


def reload(run):
    return Run.objects.get(id=run.id)


def types(run):
    return list(Event.objects.filter(run=run).order_by("sequence").values_list("type", flat=True))


@pytest.fixture(autouse=True)
def _reset_reconcilers():
    R.SEEN.clear()
    R.RELEASE.clear()
    yield
    R.RELEASE.set()  # never leave the slow reconciler's thread waiting
    R.SEEN.clear()


@pytest.fixture
def reconciler(settings):
    """Configure the reconciler by its name in tests/integration/reconcilers.py."""

    def use(name: str, timeout: float = 10.0):
        settings.AGENTRT_RECONCILER = PATH + name
        settings.AGENTRT_RECONCILE_TIMEOUT = timeout

    return use


@pytest.fixture
def pay(load_agent, sink, submit):
    """The payment agent, submitted: one http_post to the sink, then "paid"."""
    load_agent(
        turns=[
            {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": 5}}}]},
            {"text": "paid"},
        ],
        tools=("http_post",),
    )
    return submit()


KILLS = [
    pytest.param("tool.after_watermark", 0, id="after_watermark"),
    pytest.param("tool.after_execute", 1, id="after_execute"),
]


def assert_ended(run, status, reason=None):
    row = reload(run)
    assert row.status == status, (row.status, row.failure)
    assert row.lease_owner is None and row.lease_expires_at is None  # the resume let go of the run
    if reason is not None:
        assert row.failure["reason"] == reason, row.failure
    return row


def assert_still_unknown(run):
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "interrupted" and inv.effect_sent_at is not None and inv.attempt == 1
    assert inv.error["outcome"] == "unknown"
    return inv


def no_raw_text(run, text):
    row = reload(run)
    assert text not in json.dumps(row.failure), row.failure
    for payload in Event.objects.filter(run=run).values_list("payload", flat=True):
        assert text not in json.dumps(payload), payload


# -- continue ------------------------------------------------------------------


@pytest.mark.parametrize("point,sent", KILLS)
def test_continue_requeues_and_the_agent_sees_the_interrupted_observation_without_a_resend(
    monkeypatch, reconciler, pay, sink, point, sent
):
    reconciler("always_continue")
    die_at(monkeypatch, pay, point)
    assert sink.count() == sent
    assert run_resume(run_id=pay.id, via="test") == "continue"
    assert len(R.SEEN) == 1
    row = reload(pay)
    assert row.status == "QUEUED" and row.lease_owner is None
    inv = ToolInvocation.objects.get(run=pay)
    assert inv.status == "interrupted" and inv.result["error"] == "interrupted"
    assert not Approval.objects.filter(run=pay).exists()
    run_drive(run_id=pay.id)
    row = assert_ended(pay, "COMPLETED")
    assert row.final_message == "paid"
    assert sink.count() == sent  # the interrupted call was not sent again
    inv.refresh_from_db()
    assert inv.attempt == 1 and inv.status == "interrupted"
    assert Event.objects.filter(run=pay, type="tool.call.started").count() == 1
    tool = [m for m in checkpoint_latest(pay.id).conversation if m["role"] == "tool"]
    assert len(tool) == 1 and tool[0]["is_error"] is True and "interrupted" in tool[0]["content"]
    assert len(R.SEEN) == 1  # asked once


def test_continue_while_the_agent_was_deciding_retries_the_step_and_calls_the_tool_once(
    monkeypatch, reconciler, pay, sink
):
    reconciler("always_continue")
    die_at(monkeypatch, pay, "model.after_call")
    assert run_resume(run_id=pay.id) == "continue"
    run_drive(run_id=pay.id)
    assert assert_ended(pay, "COMPLETED").final_message == "paid"
    assert sink.count() == 1 and sink.sends[0]["attempt"] == "1"


# -- completed -------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,result",
    [
        ("completed_json", R.RESULT),
        ("completed_list", [1, "two", {"three": 3}]),
        ("completed_string", "already paid"),
        ("completed_zero", 0),
    ],
)
def test_completed_with_usable_json_completes_the_run_with_that_result(
    monkeypatch, reconciler, pay, sink, name, result
):
    reconciler(name)
    die_at(monkeypatch, pay, "tool.after_execute")
    assert sink.count() == 1
    assert run_resume(run_id=pay.id) == "completed"
    row = assert_ended(pay, "COMPLETED")
    assert row.result == result and row.failure is None
    assert types(pay)[-1] == "run.completed"
    assert run_drive(run_id=pay.id) is None  # nothing left to do
    assert sink.count() == 1


@pytest.mark.parametrize(
    "name", ["completed_object", "completed_nan", "completed_inf_inside", "completed_set", "completed_missing"]
)
def test_completed_with_a_result_that_is_not_usable_json_fails_internal_error(monkeypatch, reconciler, pay, sink, name):
    reconciler(name)
    die_at(monkeypatch, pay, "tool.after_execute")
    assert run_resume(run_id=pay.id) == "failed"
    row = assert_ended(pay, "FAILED", "internal_error")
    assert row.result is None
    assert_still_unknown(pay)
    assert sink.count() == 1


# -- waiting -------------------------------------------------------------------


@pytest.mark.parametrize("point,sent", KILLS)
def test_waiting_pauses_the_interrupted_call_and_approving_runs_it_once_more(
    monkeypatch, reconciler, pay, sink, operator, point, sent
):
    reconciler("waiting")
    die_at(monkeypatch, pay, point)
    assert sink.count() == sent
    assert run_resume(run_id=pay.id) == "waiting"
    row = assert_ended(pay, "WAITING_FOR_APPROVAL")
    approval = Approval.objects.get(run=pay)
    inv = assert_still_unknown(pay)
    assert approval.kind == "reconcile" and approval.status == "pending" and approval.invocation_id == inv.id
    # The reconciler's presentation, plus what runs (issue 11 item 6).
    assert approval.presentation == {
        **R.PAUSE["presentation"],
        "tool": "http_post",
        "arguments": inv.arguments,
        "side_effect": "external_write",
    }
    assert approval.capability == R.PAUSE["capability"]
    assert len(approval.request_hash) == 64
    assert inv.suspended_kind == "reconcile"
    requested = Event.objects.get(run=pay, type="approval.requested")
    assert requested.payload["kind"] == "reconcile" and requested.payload["request_hash"] == approval.request_hash
    assert types(pay)[-1] == "run.waiting_for_approval"
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash, via="api")
    assert reload(pay).status == "QUEUED"
    run_drive(run_id=pay.id)
    row = assert_ended(pay, "COMPLETED")
    assert row.final_message == "paid"
    inv.refresh_from_db()
    assert inv.status == "completed" and inv.attempt == 2
    assert sink.count() == sent + 1  # exactly one more send
    last = sink.sends[-1]
    assert last["attempt"] == "2" and last["key"] == inv.idempotency_key and last["body"] == {"amount": 5}
    assert Event.objects.filter(run=pay, type="tool.call.proposed").count() == 1  # the same step, not a new request
    assert len(R.SEEN) == 1


def test_rejecting_a_reconcile_approval_fails_the_run_without_calling_the_tool(
    monkeypatch, reconciler, pay, sink, operator
):
    reconciler("waiting")
    die_at(monkeypatch, pay, "tool.after_execute")
    assert run_resume(run_id=pay.id) == "waiting"
    approval = Approval.objects.get(run=pay)
    approval_decide(
        user=operator,
        approval_id=approval.id,
        approve=False,
        request_hash=approval.request_hash,
        reason="ledger says paid",
    )
    assert_ended(pay, "FAILED", "operator_rejected")
    assert run_drive(run_id=pay.id) is None
    assert sink.count() == 1
    assert ToolInvocation.objects.get(run=pay).attempt == 1


def test_waiting_when_nothing_was_executing_is_a_reconcile_conflict(monkeypatch, reconciler, pay, sink):
    reconciler("waiting")
    die_at(monkeypatch, pay, "model.after_call")  # the agent was deciding
    assert run_resume(run_id=pay.id) == "failed"
    assert_ended(pay, "FAILED", "reconcile_conflict")
    assert not Approval.objects.filter(run=pay).exists()
    assert not ToolInvocation.objects.filter(run=pay).exists()
    assert sink.count() == 0


@pytest.mark.parametrize("point,sent", KILLS)
def test_waiting_on_a_tool_that_is_no_longer_registered_is_a_reconcile_conflict(
    monkeypatch, reconciler, pay, sink, point, sent
):
    reconciler("waiting")
    die_at(monkeypatch, pay, point)
    spec = REGISTRY.spec("http_post")
    monkeypatch.delitem(REGISTRY._tools, "http_post")  # restored at teardown
    assert REGISTRY.spec("http_post") is None
    try:
        assert run_resume(run_id=pay.id) == "failed"
    finally:
        monkeypatch.undo()
    assert REGISTRY.spec("http_post") == spec  # restored for every other test
    assert_ended(pay, "FAILED", "reconcile_conflict")
    assert not Approval.objects.filter(run=pay).exists()
    assert sink.count() == sent


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param({"url": "SINK"}, id="missing-json"),
        pytest.param({"url": "SINK", "json": "not an object"}, id="json-not-object"),
        pytest.param({"url": "SINK", "json": {"amount": 5}, "extra": 1}, id="extra-property"),
    ],
)
def test_waiting_on_arguments_that_now_fail_the_schema_ends_the_call_invalid_decision(
    monkeypatch, reconciler, pay, sink, arguments
):
    reconciler("waiting")
    die_at(monkeypatch, pay, "tool.after_execute")
    arguments = {k: (sink.url if v == "SINK" else v) for k, v in arguments.items()}
    assert ToolInvocation.objects.filter(run=pay).update(arguments=arguments) == 1
    assert run_resume(run_id=pay.id) == "failed"
    assert_ended(pay, "FAILED", "reconcile_conflict")
    inv = ToolInvocation.objects.get(run=pay)
    assert inv.status == "failed" and inv.result["error"] == "invalid_decision"
    assert not Approval.objects.filter(run=pay).exists()
    assert sink.count() == 1


@pytest.mark.parametrize(
    "name",
    [
        "waiting_without_pause",
        "waiting_pause_deny",
        "waiting_pause_allow",
        "waiting_capability_list",
        "waiting_capability_string",
        "waiting_capability_not_json",
        "waiting_presentation_not_json",
        "waiting_presentation_list",
    ],
)
def test_waiting_with_a_pause_that_is_not_a_usable_require_approval_fails_internal_error(
    monkeypatch, reconciler, pay, sink, name
):
    reconciler(name)
    die_at(monkeypatch, pay, "tool.after_execute")
    assert run_resume(run_id=pay.id) == "failed"
    assert_ended(pay, "FAILED", "internal_error")
    assert not Approval.objects.filter(run=pay).exists()
    assert_still_unknown(pay)
    assert sink.count() == 1


# -- conflict ------------------------------------------------------------------


def test_conflict_fails_the_run_reconcile_conflict_carrying_the_detail(monkeypatch, reconciler, pay, sink):
    reconciler("conflict_with_detail")
    die_at(monkeypatch, pay, "tool.after_execute")
    assert run_resume(run_id=pay.id) == "failed"
    row = assert_ended(pay, "FAILED", "reconcile_conflict")
    assert R.DETAIL in row.failure["message"]
    failed = Event.objects.get(run=pay, type="run.failed")
    assert (
        failed.payload["failure"]["reason"] == "reconcile_conflict" and R.DETAIL in failed.payload["failure"]["message"]
    )
    assert run_drive(run_id=pay.id) is None
    assert sink.count() == 1


def test_conflict_without_detail_still_fails_reconcile_conflict_with_a_message(monkeypatch, reconciler, pay, sink):
    reconciler("conflict_without_detail")
    die_at(monkeypatch, pay, "tool.after_watermark")
    assert run_resume(run_id=pay.id) == "failed"
    row = assert_ended(pay, "FAILED", "reconcile_conflict")
    assert row.failure["message"]
    assert sink.count() == 0


# -- answers that are not a Reconciliation, errors, timeouts -----------------------


@pytest.mark.parametrize(
    "name",
    [
        "unknown_outcome",
        "no_outcome",
        "returns_42",
        "returns_none",
        "returns_string",
        "raises",
        "raises_system_exit",
        "raises_keyboard_interrupt",
        "assigns_view",  # the RunView is frozen: assigning to it raises
    ],
)
def test_a_bad_answer_or_an_error_fails_internal_error_and_the_worker_survives(
    monkeypatch, reconciler, pay, sink, name
):
    reconciler(name)
    die_at(monkeypatch, pay, "tool.after_execute")
    assert run_resume(run_id=pay.id) == "failed"  # returned: nothing was raised into the worker
    assert_ended(pay, "FAILED", "internal_error")
    no_raw_text(pay, R.SECRET)
    no_raw_text(pay, "kaboom")
    assert not Approval.objects.filter(run=pay).exists()
    assert_still_unknown(pay)
    assert run_drive(run_id=pay.id) is None
    assert sink.count() == 1


def test_a_reconciler_past_the_timeout_fails_internal_error_and_its_late_answer_changes_nothing(
    monkeypatch, reconciler, pay, sink
):
    reconciler("slow", timeout=0.5)
    die_at(monkeypatch, pay, "tool.after_execute")
    assert run_resume(run_id=pay.id) == "failed"
    # It did not wait for the answer: the reconciler is still blocked on RELEASE, which only this test sets
    # (had the resume waited, the reconciler's "completed" would have been its outcome, and no thread would be left).
    assert not R.RELEASE.is_set()
    assert len(R.SEEN) == 1
    row = assert_ended(pay, "FAILED", "internal_error")
    assert row.result is None
    threads = [t for t in threading.enumerate() if t.name == "reconciler"]
    assert threads, "the timed-out reconciler should still be running"
    R.RELEASE.set()
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    row = assert_ended(pay, "FAILED", "internal_error")
    assert row.result is None  # its late "completed" answer was dropped
    assert_still_unknown(pay)
    assert sink.count() == 1


def test_a_reconciler_path_that_does_not_import_fails_internal_error_and_the_worker_survives(
    monkeypatch, settings, pay, sink
):
    settings.AGENTRT_RECONCILER = PATH + "no_such_reconciler"
    die_at(monkeypatch, pay, "tool.after_execute")
    assert run_resume(run_id=pay.id) == "failed"
    assert_ended(pay, "FAILED", "internal_error")
    assert sink.count() == 1


# -- the RunView -----------------------------------------------------------------


def test_the_reconciler_sees_copies_of_the_run_its_steps_invocations_and_approvals(
    monkeypatch, reconciler, pay, sink, operator
):
    reconciler("waiting")
    die_at(monkeypatch, pay, "tool.after_watermark")
    assert run_resume(run_id=pay.id) == "waiting"
    (first,) = R.SEEN
    assert isinstance(first, RunView)
    inv = ToolInvocation.objects.get(run=pay)
    assert first.run["id"] == str(pay.id) and first.run["status"] == "RUNNING" and first.run["agent"] == "bot"
    assert [(s["step_number"], s["attempt_number"], s["status"]) for s in first.steps] == [(1, 1, "completed")]
    (seen_inv,) = first.invocations
    assert seen_inv["id"] == str(inv.id) and seen_inv["tool_name"] == "http_post"
    assert seen_inv["status"] == "interrupted" and seen_inv["effect_sent_at"] is not None
    assert seen_inv["arguments"] == {"url": sink.url, "json": {"amount": 5}}
    assert (
        seen_inv["read_only"] is False
        and seen_inv["attempt"] == 1
        and seen_inv["idempotency_key"] == inv.idempotency_key
    )
    assert first.approvals == []
    with pytest.raises(Exception):
        first.run = {}  # frozen

    # The approved re-run dies too; the next reconciler sees the decided approval.
    approval = Approval.objects.get(run=pay)
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash)
    reconciler("conflict_with_detail")
    die_at(monkeypatch, pay, "tool.after_watermark", owner="second-dying-worker")
    assert sink.count() == 0
    assert run_resume(run_id=pay.id) == "failed"
    assert_ended(pay, "FAILED", "reconcile_conflict")
    second = R.SEEN[1]
    assert [(a["id"], a["kind"], a["status"], a["request_hash"]) for a in second.approvals] == [
        (str(approval.id), "reconcile", "approved", approval.request_hash)
    ]
    (seen_inv,) = second.invocations
    assert seen_inv["status"] == "interrupted" and seen_inv["attempt"] == 2 and seen_inv["effect_sent_at"] is not None


def test_mutating_the_view_then_continuing_changes_nothing_persisted(monkeypatch, reconciler, pay, sink):
    reconciler("mutates_then_continue")
    die_at(monkeypatch, pay, "tool.after_execute")
    calls_before = list(ModelCall.objects.filter(run=pay).values_list("step_number", "attempt_number", "status"))
    assert run_resume(run_id=pay.id) == "continue"
    row = reload(pay)
    assert row.status == "QUEUED" and row.result is None and row.final_message is None
    inv = ToolInvocation.objects.get(run=pay)
    assert inv.status == "interrupted" and inv.result["error"] == "interrupted"
    assert inv.arguments == {"url": sink.url, "json": {"amount": 5}}
    assert ToolInvocation.objects.filter(run=pay).count() == 1
    assert (
        list(ModelCall.objects.filter(run=pay).values_list("step_number", "attempt_number", "status")) == calls_before
    )
    assert not Approval.objects.filter(run=pay).exists()
    run_drive(run_id=pay.id)
    assert assert_ended(pay, "COMPLETED").final_message == "paid"
    assert sink.count() == 1


def test_mutating_the_view_then_waiting_pauses_and_reruns_the_recorded_arguments(
    monkeypatch, reconciler, pay, sink, operator
):
    reconciler("mutates_then_waiting")
    die_at(monkeypatch, pay, "tool.after_execute")
    assert run_resume(run_id=pay.id) == "waiting"
    (approval,) = Approval.objects.filter(run=pay)
    assert approval.kind == "reconcile" and approval.presentation == shown(R.PAUSE["presentation"], sink)
    assert ToolInvocation.objects.get(run=pay).arguments == {"url": sink.url, "json": {"amount": 5}}
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash)
    run_drive(run_id=pay.id)
    assert_ended(pay, "COMPLETED")
    assert sink.count() == 2
    assert [s["body"] for s in sink.sends] == [{"amount": 5}, {"amount": 5}]
    assert [s["path"] for s in sink.sends] == ["/effect", "/effect"]


# -- a dict and an object with attributes --------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "completed_json",
        "object_completed",
        "dataclass_completed",
        "namespace_completed",
        "pydantic_completed",
        "slots_completed",
        "namedtuple_completed",
        "properties_completed",
    ],
)
def test_a_reconciliation_as_a_dict_or_an_object_with_attributes_is_accepted(monkeypatch, reconciler, pay, sink, name):
    reconciler(name)
    die_at(monkeypatch, pay, "tool.after_execute")
    assert run_resume(run_id=pay.id) == "completed"
    assert assert_ended(pay, "COMPLETED").result == R.RESULT
    assert sink.count() == 1


def test_an_object_reconciliation_can_continue(monkeypatch, reconciler, pay, sink):
    reconciler("object_continue")
    die_at(monkeypatch, pay, "tool.after_execute")
    assert run_resume(run_id=pay.id) == "continue"
    run_drive(run_id=pay.id)
    assert assert_ended(pay, "COMPLETED").final_message == "paid"
    assert sink.count() == 1


def test_an_object_reconciliation_can_conflict(monkeypatch, reconciler, pay, sink):
    reconciler("object_conflict")
    die_at(monkeypatch, pay, "tool.after_execute")
    assert run_resume(run_id=pay.id) == "failed"
    assert R.DETAIL in assert_ended(pay, "FAILED", "reconcile_conflict").failure["message"]


def test_an_object_reconciliation_can_wait_with_an_object_pause(monkeypatch, reconciler, pay, sink, operator):
    reconciler("object_waiting")
    die_at(monkeypatch, pay, "tool.after_watermark")
    assert run_resume(run_id=pay.id) == "waiting"
    approval = Approval.objects.get(run=pay)
    assert approval.kind == "reconcile" and approval.presentation == shown(R.PAUSE["presentation"], sink)
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash)
    run_drive(run_id=pay.id)
    assert_ended(pay, "COMPLETED")
    assert sink.count() == 1 and sink.sends[0]["attempt"] == "2"
