"""Unknown outcomes, changed tools, approvals and cancellation of MCP calls (issue 36, items 2–4), in-process on
PostgreSQL against our own effects server over stdio and Streamable HTTP."""

from __future__ import annotations

import threading

import pytest

from approvals.models import Approval
from approvals.services import approval_decide
from runs.models import Event, ToolInvocation
from runs.runtime.executor import run_drive
from runs.runtime.resume import run_resume
from runs.services.lifecycle import run_cancel
from tests.conftest import wait_for
from tests.crash import die_at
from tests.mcptools.fixtures import fx_stdio
from tests.mcptools.test_mcp_runs import WRITE, call, reload, tool_messages

pytestmark = pytest.mark.django_db(transaction=True)

ASK = {"default": "allow", "rules": [{"tool": WRITE, "decision": "require_approval"}]}


def decide(operator, run, *, approve=True):
    approval = Approval.objects.get(run=run, status="pending")
    approval_decide(
        user=operator, approval_id=approval.id, approve=approve, request_hash=approval.request_hash, via="api"
    )
    return approval


@pytest.fixture
def fx(mcp_servers, fx_state):
    mcp_servers({"fx": fx_stdio(fx_state, timeout=5)})
    return fx_state


# -- unknown outcomes ----------------------------------------------------------


def test_a_server_that_dies_after_the_effect_is_an_unknown_outcome_never_sent_again(fx, load_agent, submit, operator):
    """The stream breaks after the effect (the server process dies before answering): uncertain, an operator
    decides; rejecting ends the run with the one effect; nothing is sent again."""
    load_agent(turns=[call("mcp__fx__write_then_die", name="b"), {"text": "done"}], tools=("mcp__fx__write_then_die",))
    run = submit()
    assert run_drive(run_id=run.id).kind.value == "suspended"
    row = reload(run)
    assert row.status == "WAITING_FOR_APPROVAL"
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "uncertain" and inv.outcome == "uncertain" and inv.error["error"] == "connection_lost"
    approval = Approval.objects.get(run=run, status="pending")
    assert approval.kind == "uncertain_side_effect"
    assert approval.presentation["mcp"]["server"] == "fx" and "hints" in approval.presentation["mcp"]["note"]
    assert len(fx.effects()) == 1 and len(fx.calls("write_then_die")) == 1
    decide(operator, run, approve=False)
    assert reload(run).status == "FAILED"
    assert len(fx.effects()) == 1 and len(fx.calls("write_then_die")) == 1


def test_an_approved_rerun_of_an_unknown_outcome_is_sent_once_more_with_the_same_key(fx, load_agent, submit, operator):
    load_agent(turns=[call("mcp__fx__write_then_die", name="b"), {"text": "done"}], tools=("mcp__fx__write_then_die",))
    run = submit()
    run_drive(run_id=run.id)
    first = fx.calls("write_then_die")
    decide(operator, run, approve=True)  # the operator's grant: one more attempt (it dies again: unknown again)
    run_drive(run_id=run.id)
    calls = fx.calls("write_then_die")
    assert len(calls) == 2 and calls[0]["key"] == calls[1]["key"] == first[0]["key"]
    assert reload(run).status == "WAITING_FOR_APPROVAL"
    assert ToolInvocation.objects.get(run=run).attempt == 2


def test_a_read_only_call_whose_stream_broke_is_sent_again_once(fx, load_agent, submit):
    load_agent(turns=[call("mcp__fx__flaky_read"), {"text": "done"}], tools=("mcp__fx__flaky_read",))
    run = submit()
    run_drive(run_id=run.id)
    assert reload(run).status == "COMPLETED"
    assert len(fx.calls("flaky_read")) == 2  # the first process died; a new request on a new process answered
    inv = ToolInvocation.objects.get(run=run)
    assert inv.outcome == "succeeded" and inv.result["content"][0]["text"] == "answered"


def test_a_side_effect_without_an_answer_in_time_is_uncertain_and_left_to_finish(
    fx, mcp_servers, fx_state, load_agent, submit
):
    mcp_servers({"fx": fx_stdio(fx_state, timeout=1)})
    load_agent(
        turns=[call("mcp__fx__wait_then_write", name="slow"), {"text": "done"}], tools=("mcp__fx__wait_then_write",)
    )
    run = submit()
    assert run_drive(run_id=run.id).kind.value == "suspended"
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "uncertain" and inv.error["error"] == "timeout"
    assert len(fx.calls("wait_then_write")) == 1 and fx.effects() == []
    # Not cancelled: the request is still in flight and takes effect once the server gets to it.
    fx.touch("go")
    wait_for(lambda: fx.effects(), timeout=30, message="the late effect")
    assert len(fx.calls("wait_then_write")) == 1 and len(fx.effects()) == 1


# -- the pin -------------------------------------------------------------------


def test_a_tool_changed_since_the_pin_fails_tool_changed_before_anything_is_sent(fx, load_agent, submit):
    load_agent(turns=[call(WRITE, name="a"), {"text": "done"}], tools=(WRITE,))
    fx.touch("changed")  # after publishing: the server's `write` has another input schema now
    run = submit()
    run_drive(run_id=run.id)
    assert reload(run).status == "COMPLETED"  # the model saw the failure and answered
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "failed" and inv.result["error"] == "tool_changed" and inv.effect_sent_at is None
    assert fx.calls("write") == [] and fx.effects() == []
    (message,) = tool_messages(run)
    assert message["is_error"] and "tool_changed" in message["content"]


def test_a_change_between_the_slice_and_the_call_is_caught_right_before_the_send(fx, load_agent, submit, monkeypatch):
    """The run's view of the pins is taken once per slice; the call compares again right before it is sent."""
    from runs.tools.mcp import tools as mcp_tools

    load_agent(turns=[call(WRITE, name="a"), {"text": "done"}], tools=(WRITE,))
    checked = mcp_tools._check_pin

    def change_then_check(*args, **kwargs):
        fx.touch("changed")
        return checked(*args, **kwargs)

    monkeypatch.setattr(mcp_tools, "_check_pin", change_then_check)
    run = submit()
    run_drive(run_id=run.id)
    inv = ToolInvocation.objects.get(run=run)
    assert inv.result["error"] == "tool_changed" and inv.outcome == "failed"
    assert inv.effect_sent_at is not None  # a side effect's watermark comes first; nothing was sent after it
    assert fx.calls("write") == [] and fx.effects() == []


def test_a_pending_approval_of_a_changed_tool_is_not_honoured(fx, load_agent, submit, operator):
    load_agent(turns=[call(WRITE, name="a"), {"text": "done"}], tools=(WRITE,), policy=ASK)
    run = submit()
    run_drive(run_id=run.id)
    assert reload(run).status == "WAITING_FOR_APPROVAL"
    fx.touch("changed")
    decide(operator, run)
    run_drive(run_id=run.id)
    (invalidated,) = Event.objects.filter(run=run, type="approval.invalidated")
    assert "no longer lists 'write' as it was" in invalidated.payload["reason"]
    assert fx.calls("write") == [] and fx.effects() == []
    assert reload(run).status == "COMPLETED"  # the model saw the failure and answered
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "failed" and inv.result["error"] == "tool_changed" and inv.effect_sent_at is None
    assert Approval.objects.get(run=run).status == "invalidated"


def test_an_interrupted_call_of_a_changed_tool_is_a_reconcile_conflict(fx, load_agent, submit, monkeypatch):
    """The worker dies after the call (simulated: tests/crash.py); by the takeover the server's tool changed."""
    load_agent(turns=[call(WRITE, name="a"), {"text": "done"}], tools=(WRITE,))
    run = submit()
    die_at(monkeypatch, run, "tool.after_execute")
    assert len(fx.effects()) == 1
    fx.touch("changed")
    assert run_resume(run_id=run.id, via="test") == "failed"
    row = reload(run)
    assert row.status == "FAILED" and row.failure["reason"] == "reconcile_conflict"
    assert not Approval.objects.filter(run=run).exists()  # never an approval to re-run what is no longer pinned
    assert len(fx.effects()) == 1


def test_an_interrupted_call_of_an_unchanged_tool_waits_for_a_decision_showing_the_hints(
    fx, load_agent, submit, monkeypatch, operator
):
    load_agent(turns=[call(WRITE, name="a"), {"text": "done"}], tools=(WRITE,))
    run = submit()
    die_at(monkeypatch, run, "tool.after_watermark")
    assert fx.effects() == []
    assert run_resume(run_id=run.id, via="test") == "waiting"
    approval = Approval.objects.get(run=run, status="pending")
    assert approval.kind == "interrupted_side_effect"
    assert approval.presentation["mcp"]["server_hints"]["readOnlyHint"] is True  # shown, labelled, not trusted
    decide(operator, run)  # the hash recomputed from the pinned spec matches: no second approval
    run_drive(run_id=run.id)
    assert reload(run).status == "COMPLETED" and len(fx.effects()) == 1


# -- cancellation --------------------------------------------------------------


def test_a_read_only_call_is_abandoned_on_cancel_with_notifications_cancelled(fx, load_agent, submit, settings):
    settings.AGENTRT_LEASE_SECONDS = 2  # the worker's heartbeat, which brings it the cancel, every 2/3 s
    load_agent(turns=[call("mcp__fx__slow_read", seconds=30), {"text": "done"}], tools=("mcp__fx__slow_read",))
    run = submit()
    worker = threading.Thread(target=run_drive, kwargs={"run_id": run.id})
    worker.start()
    wait_for(lambda: fx.calls("slow_read"), timeout=30, message="the call to reach the server")
    run_cancel(run=reload(run), by="test")
    worker.join(60)
    assert not worker.is_alive()
    wait_for(lambda: fx.lines("cancelled.jsonl"), timeout=30, message="the server to see notifications/cancelled")
    assert reload(run).status == "CANCELLED"


def test_a_sent_side_effect_is_not_cancelled_and_its_answer_is_kept(fx, load_agent, submit, settings, monkeypatch):
    from runs.domain.cancellation import Token

    settings.AGENTRT_LEASE_SECONDS = 2
    seen = threading.Event()  # the worker's token got the cancel (its heartbeat brought it)
    cancel = Token.cancel

    def observed(self, reason):
        cancel(self, reason)
        seen.set()

    monkeypatch.setattr(Token, "cancel", observed)
    load_agent(
        turns=[call("mcp__fx__wait_then_write", name="w"), {"text": "done"}], tools=("mcp__fx__wait_then_write",)
    )
    run = submit()
    worker = threading.Thread(target=run_drive, kwargs={"run_id": run.id})
    worker.start()
    wait_for(lambda: fx.calls("wait_then_write"), timeout=30, message="the call to reach the server")
    run_cancel(run=reload(run), by="test")
    wait_for(seen.is_set, message="the running worker to see the cancel")
    fx.touch("go")  # only now does the server answer: the cancel reached the call while it was in flight
    worker.join(60)
    assert not worker.is_alive()
    assert reload(run).status == "CANCELLED"
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "completed" and inv.outcome == "succeeded" and inv.result["content"][0]["text"] == "wrote w"
    assert len(fx.effects()) == 1


# -- Streamable HTTP -------------------------------------------------------------


def test_over_http_the_key_travels_in_meta_and_as_the_idempotency_key_header(
    mcp_servers, fx_state, fx_http, load_agent, submit
):
    url, host, _ = fx_http
    mcp_servers({"fxh": {"url": url, "tools": {"write": "side_effect", "echo": "read_only"}}}, hosts=[host])
    load_agent(
        turns=[call("mcp__fxh__echo", text="x"), call("mcp__fxh__write", name="h"), {"text": "done"}],
        tools=("mcp__fxh__write", "mcp__fxh__echo"),
    )
    run = submit()
    run_drive(run_id=run.id)
    assert reload(run).status == "COMPLETED"
    inv = ToolInvocation.objects.get(run=run, tool_name="mcp__fxh__write")
    (effect,) = fx_state.effects()
    assert effect["key"] == effect["header_key"] == inv.idempotency_key
    (echo,) = fx_state.calls("echo")
    assert echo["header_key"] is None  # a read-only call sends no Idempotency-Key header


def test_over_http_a_server_that_dies_after_the_effect_is_an_unknown_outcome(
    mcp_servers, fx_state, fx_http, load_agent, submit
):
    url, host, proc = fx_http
    mcp_servers({"fxh": {"url": url, "tools": {"write_then_die": "side_effect"}}}, hosts=[host])
    load_agent(
        turns=[call("mcp__fxh__write_then_die", name="d"), {"text": "done"}], tools=("mcp__fxh__write_then_die",)
    )
    run = submit()
    assert run_drive(run_id=run.id).kind.value == "suspended"
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "uncertain" and inv.effect_sent_at is not None
    assert len(fx_state.effects()) == 1 and proc.wait(10) == 3


def test_over_http_a_server_that_is_down_is_failed_nothing_sent(mcp_servers, fx_state, fx_http, load_agent, submit):
    url, host, proc = fx_http
    mcp_servers({"fxh": {"url": url, "tools": {"write": "side_effect"}}}, hosts=[host])
    load_agent(turns=[call("mcp__fxh__write", name="x"), {"text": "done"}], tools=("mcp__fxh__write",))
    proc.terminate()
    proc.wait(10)
    run = submit()
    run_drive(run_id=run.id)
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "failed" and inv.outcome == "failed" and inv.result["error"] == "mcp_unavailable"
    assert fx_state.effects() == []
