"""The tool pipeline (DESIGN §7) through `run_loop`, with fakes. No database."""

from __future__ import annotations

import json

import pytest

from runs.domain.errors import ToolFailure, WorkerFenced
from runs.domain.loop import run_loop
from runs.domain.values import CancelReason, OutcomeKind, RunLimits, ToolSpec
from tests.unit.fakes import (
    ECHO,
    POST,
    RUN_ID,
    FakeLease,
    FakeStore,
    FixedPolicy,
    build_context,
    echo_call,
    post_call,
)


def tool_entries(h) -> list[dict]:
    return [m for m in h.ctx.state.conversation if m["role"] == "tool"]


def error_code(entry: dict) -> str:
    return json.loads(entry["content"])["error"]


# -- side effects and their watermark -------------------------------------------


def test_side_effect_call_adds_exactly_one_watermark_committed_before_the_call():
    seen = {}
    h = build_context([{"tool_calls": [echo_call("read"), post_call(1)]}, {"text": "done"}])

    def post(arguments, context):
        # The watermark for *this* invocation must already be durable.
        seen["watermarks"] = [w.invocation_id for w in h.store.watermarks]
        seen["invocation"] = context.invocation_id
        seen["commits"] = len(h.store.commits)
        return {"posted": arguments["n"]}

    h.tools.add(POST, post)

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.COMPLETED
    assert seen["watermarks"] == [seen["invocation"]]
    assert seen["commits"] == 2  # the run start and the step's decisions, not yet the results
    assert len(h.store.watermarks) == 1
    # One read-only + one side-effect call: still 1 + 2 commits, plus one watermark.
    assert len(h.store.commits) == 3
    assert h.store.log == [
        ("commit", 1),
        ("commit", 2),
        ("tool", "echo"),
        ("watermark", seen["invocation"]),
        ("tool", "post"),
        ("commit", 3),
    ]


def test_watermark_names_the_invocation_and_its_idempotency_key():
    h = build_context([{"tool_calls": [post_call(5)]}, {"text": "done"}])

    run_loop(h.ctx)

    (mark,) = h.store.watermarks
    authorized = [i for i in h.store.invocation_inserts() if i.tool_name == "post"]
    assert [i.status for i in authorized] == ["authorized"]
    assert mark.invocation_id == authorized[0].id
    assert mark.attempt == 1
    assert mark.payload["idempotency_key"] == f"{RUN_ID}:1:call_1_0"
    assert mark.payload["tool"] == "post"
    assert authorized[0].read_only is False and authorized[0].side_effect == "external_write"


def test_read_only_calls_get_no_watermark():
    h = build_context([{"tool_calls": [echo_call("a"), echo_call("b")]}, {"text": "done"}])

    run_loop(h.ctx)

    assert h.store.watermarks == []
    assert h.tools.count("echo") == 2


def test_tool_context_carries_run_step_key_and_token():
    got = {}
    h = build_context([{"tool_calls": [echo_call("a")]}, {"text": "done"}])

    def echo(arguments, context):
        got.update(run_id=context.run_id, step=context.step_number, key=context.idempotency_key, token=context.token)
        return "a"

    h.tools.add(ECHO, echo)
    run_loop(h.ctx)

    assert got == {"run_id": RUN_ID, "step": 1, "key": f"{RUN_ID}:1:call_1_0", "token": h.token}


# -- malformed calls become failed results ----------------------------------------


@pytest.mark.parametrize(
    "call, code",
    [
        ({"name": "echo", "arguments": "{not json"}, "invalid_arguments"),
        ({"name": "echo", "arguments": "[1, 2]"}, "invalid_arguments"),
        ({"name": "no_such_tool", "arguments": {"text": "x"}}, "unknown_tool"),
        ({"name": "echo", "arguments": {"text": 5}}, "schema_invalid"),
        ({"name": "echo", "arguments": {"text": "x", "extra": 1}}, "schema_invalid"),
    ],
    ids=["invalid-json", "not-an-object", "unknown-tool", "wrong-type", "extra-property"],
)
def test_malformed_call_becomes_a_failed_result_the_model_sees(call, code):
    h = build_context([{"tool_calls": [call]}, {"text": "ok"}])

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.COMPLETED
    assert h.tools.calls == []
    (entry,) = tool_entries(h)
    assert entry["is_error"] is True
    assert error_code(entry) == code
    # The next request carries the failed result.
    assert entry in h.provider.requests[1].messages
    (inserted,) = h.store.invocation_inserts()
    assert inserted.status == "failed" and inserted.error["error"] == code
    failed = [e for e in h.store.all_events() if e.type == "tool.call.failed"]
    assert [e.payload["executed"] for e in failed] == [False]
    assert h.ctx.progress.usage.tool_calls == 0


def test_tool_registered_but_not_pinned_to_the_agent_is_unknown():
    h = build_context([{"tool_calls": [post_call(1)]}, {"text": "ok"}], agent_tools=["echo"])

    run_loop(h.ctx)

    assert h.tools.calls == []
    assert h.store.watermarks == []
    assert [error_code(e) for e in tool_entries(h)] == ["unknown_tool"]


def test_a_bad_call_does_not_stop_the_good_calls_of_its_batch():
    h = build_context([{"tool_calls": [{"name": "echo", "arguments": "{"}, echo_call("fine")]}, {"text": "ok"}])

    run_loop(h.ctx)

    assert h.tools.count("echo") == 1
    assert [(e["tool_call_id"], e["is_error"]) for e in tool_entries(h)] == [("call_1_0", True), ("call_1_1", False)]


def test_tool_failure_and_tool_crash_are_failed_results_not_worker_errors():
    h = build_context([{"tool_calls": [echo_call("boom"), echo_call("crash")]}, {"text": "ok"}])

    def echo(arguments, context):
        if arguments["text"] == "boom":
            raise ToolFailure("upstream_down", "the upstream said no")
        raise KeyError("bug")

    h.tools.add(ECHO, echo)

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.COMPLETED
    assert [error_code(e) for e in tool_entries(h)] == ["upstream_down", "tool_error"]
    failed = [e for e in h.store.all_events() if e.type == "tool.call.failed"]
    assert [e.payload["executed"] for e in failed] == [True, True]
    assert h.ctx.progress.usage.tool_calls == 2  # executed calls count, even failed ones


def test_the_identical_call_guard_is_the_breaker_one_counter_no_refusal():
    # Step 5 used to refuse the fourth identical call (`repeated_call`) and let the loop go on; it is now
    # the breaker's (tests/unit/test_guards.py): two runs, a tool-free turn, then `tool_loop_detected`.
    h = build_context([{"tool_calls": [echo_call("same")]}] * 4 + [{"text": "ok"}])

    outcome = run_loop(h.ctx)

    assert h.tools.count("echo") == 2
    assert [error_code(e) if e["is_error"] else None for e in tool_entries(h)] == [None, None]
    assert outcome.failure.reason == "tool_loop_detected"


# -- the tool-call budget ---------------------------------------------------------


def test_tool_call_budget_fits_the_batch():
    h = build_context(
        [{"tool_calls": [echo_call("a"), echo_call("b"), echo_call("c")]}, {"text": "ok"}],
        limits=RunLimits(max_tool_calls=1),
    )

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.COMPLETED
    assert h.tools.count("echo") == 1
    assert h.tools.calls[0][1] == {"text": "a"}
    entries = tool_entries(h)
    assert [e["is_error"] for e in entries] == [False, True, True]
    assert [error_code(e) for e in entries[1:]] == ["tool.budget_exhausted", "tool.budget_exhausted"]
    assert h.ctx.progress.usage.tool_calls == 1
    statuses = [i.status for i in h.store.invocation_inserts()]
    assert statuses == ["authorized", "failed", "failed"]


def test_tool_call_budget_already_spent_refuses_the_whole_batch():
    h = build_context(
        [{"tool_calls": [echo_call("a")]}, {"tool_calls": [echo_call("b")]}, {"text": "ok"}],
        limits=RunLimits(max_tool_calls=1),
    )

    outcome = run_loop(h.ctx)

    # An exhausted tool-call budget puts the next request into synthesis-only
    # mode; a model that calls a tool anyway fails closed and nothing runs.
    assert h.tools.count("echo") == 1
    assert outcome.kind is OutcomeKind.FAILED
    assert outcome.failure.error_class == "SynthesisReserveViolation"
    assert outcome.failure.details["dimension"] == "tool_calls_exhausted"
    assert h.ctx.progress.usage.tool_calls == 1


# -- policy -----------------------------------------------------------------------


@pytest.mark.parametrize("decision, code", [("deny", "denied_by_policy"), ("require_approval", "approval_required")])
def test_policy_deny_and_require_approval_give_failed_results(decision, code):
    h = build_context(
        [{"tool_calls": [post_call(1), echo_call("ok")]}, {"text": "ok"}], policy=FixedPolicy({"post": decision})
    )

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.COMPLETED
    assert h.tools.count("post") == 0
    assert h.tools.count("echo") == 1
    assert h.store.watermarks == []
    entries = tool_entries(h)
    assert entries[0]["is_error"] is True and error_code(entries[0]) == code
    assert entries[1]["is_error"] is False


def test_a_policy_that_raises_fails_closed():
    class Broken:
        def evaluate(self, tool_name, arguments):
            raise RuntimeError("policy bug")

    h = build_context([{"tool_calls": [post_call(1)]}, {"text": "ok"}], policy=Broken())

    run_loop(h.ctx)

    assert h.tools.calls == []
    assert [error_code(e) for e in tool_entries(h)] == ["approval_required"]


# -- cancellation -------------------------------------------------------------------


def test_cancel_before_the_watermark_stops_cleanly_without_calling_the_tool():
    def cancel_at_watermark(point, h):
        if point == "tool.before_watermark":
            h.token.cancel(CancelReason.REQUESTED)

    h = build_context([{"tool_calls": [post_call(1)]}, {"text": "never"}], fault=cancel_at_watermark)

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.CANCELLED
    assert h.tools.calls == []
    assert h.store.watermarks == []
    types = [e.type for e in outcome.pending.events]
    assert "tool.run_cancelled" in types
    assert "tool.call.started" not in types
    assert [u.status for u in outcome.pending.invocation_updates] == ["cancelled"]
    assert len(h.provider.requests) == 1
    assert h.ctx.progress.usage.tool_calls == 0


def test_cancel_after_watermark_keeps_the_result():
    h = build_context([{"tool_calls": [post_call(3), post_call(4)]}, {"text": "never"}])

    def post(arguments, context):
        context.token.cancel(CancelReason.REQUESTED)  # the cancel arrives while the effect runs
        return {"posted": arguments["n"]}

    h.tools.add(POST, post)

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.CANCELLED
    assert h.tools.count("post") == 1
    assert len(h.store.watermarks) == 1
    first, second = outcome.pending.invocation_updates
    assert (first.status, first.result) == ("completed", {"posted": 3})
    assert second.status == "cancelled"
    types = [e.type for e in outcome.pending.events]
    assert types == ["tool.call.completed", "tool.run_cancelled"]
    assert h.ctx.progress.usage.tool_calls == 1
    assert len(h.provider.requests) == 1


def test_cancel_during_a_read_only_call_keeps_it_and_cancels_the_rest():
    h = build_context([{"tool_calls": [echo_call("a"), echo_call("b")]}, {"text": "never"}])

    def echo(arguments, context):
        context.token.cancel(CancelReason.REQUESTED)
        return arguments["text"]

    h.tools.add(ECHO, echo)

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.CANCELLED
    assert h.tools.count("echo") == 1
    assert [u.status for u in outcome.pending.invocation_updates] == ["completed", "cancelled"]


def test_fenced_token_while_the_effect_runs_ends_fenced_with_the_late_outcome():
    h = build_context([{"tool_calls": [post_call(9)]}, {"text": "never"}])

    def post(arguments, context):
        context.token.cancel(CancelReason.FENCED)  # the supervisor lost the lease meanwhile
        return {"posted": 9}

    h.tools.add(POST, post)

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.FENCED
    assert outcome.pending is None
    assert [(c["tool"], c["result"]) for c in outcome.late["calls"]] == [("post", {"posted": 9})]


# -- self-fencing -------------------------------------------------------------------


def test_lease_monitor_refusing_the_effect_raises_worker_fenced_and_skips_the_call():
    h = build_context([{"tool_calls": [post_call(1)]}, {"text": "never"}], lease=FakeLease(False))

    with pytest.raises(WorkerFenced):
        run_loop(h.ctx)

    assert h.tools.calls == []
    assert h.store.watermarks == []  # a stale worker writes no watermark for a call it will not make
    assert h.lease.asked == 1


def test_a_lease_lost_between_the_watermark_and_the_call_skips_the_call_and_leaves_the_watermark():
    h = build_context([{"tool_calls": [post_call(1)]}, {"text": "never"}], lease=FakeLease([True, False]))

    with pytest.raises(WorkerFenced):
        run_loop(h.ctx)

    assert h.tools.calls == []
    assert len(h.store.watermarks) == 1  # the new owner will find it and ask
    assert h.lease.asked == 2


def test_fenced_watermark_raises_worker_fenced_and_skips_the_call():
    h = build_context([{"tool_calls": [post_call(1)]}, {"text": "never"}], store=FakeStore(fence_on_watermark=1))

    with pytest.raises(WorkerFenced):
        run_loop(h.ctx)

    assert h.tools.calls == []
    assert h.store.watermarks == []


def test_read_only_calls_do_not_ask_the_lease_monitor():
    h = build_context([{"tool_calls": [echo_call("a")]}, {"text": "ok"}], lease=FakeLease(False))

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.COMPLETED
    assert h.lease.asked == 0


@pytest.mark.parametrize("how", ["self-fence", "fenced-watermark"])
def test_fence_after_a_finished_side_effect_keeps_its_outcome_as_late(how):
    """DESIGN §10: a worker that loses its lease after a side effect it started
    has finished writes that call's outcome into its `run.fenced` event."""
    if how == "self-fence":
        # The lease is asked before and after each watermark: the second call's first check fails.
        h = build_context(
            [{"tool_calls": [post_call(1), post_call(2)]}, {"text": "x"}], lease=FakeLease([True, True, False])
        )
    else:
        h = build_context(
            [{"tool_calls": [post_call(1), post_call(2)]}, {"text": "x"}], store=FakeStore(fence_on_watermark=2)
        )

    with pytest.raises(WorkerFenced) as info:
        run_loop(h.ctx)

    assert h.tools.count("post") == 1  # the first effect happened
    late = info.value.late
    assert late is not None, "the first call's finished outcome was dropped from the fenced error"
    assert [(c["tool"], c["result"]) for c in late["calls"]] == [("post", {"posted": 1})]


def test_side_effect_spec_flag_decides_the_watermark_not_the_name():
    readonly_post = ToolSpec(name="post", parameters=POST.parameters, read_only=True)
    h = build_context([{"tool_calls": [post_call(1)]}, {"text": "ok"}])
    h.tools.add(readonly_post, lambda arguments, context: {"ok": True})

    run_loop(h.ctx)

    assert h.store.watermarks == []
    assert h.tools.count("post") == 1


# -- the parsed-argument scrub ------------------------------------------------------


def test_dispatch_scrubs_the_arguments_it_parses_whatever_its_caller_scrubbed():
    """The loop scrubs a turn before the pipeline sees it (scrub_turn, which
    also decodes `\\u` escapes), but the pipeline does not rely on that: a
    call handed to `dispatch` with a secret hidden behind a JSON escape is
    redacted once parsed, in the invocation row and `tool.call.proposed`."""
    from runs.domain.pipeline import dispatch
    from runs.domain.values import ToolCallRequest
    from runs.domain.writes import UnitOfWork

    h = build_context([{"text": "unused"}])
    raw = '{"text": "pay sk-\\u0041BCDEFGHIJKLMNOPQRSTUVWX"}'  # the text patterns do not see sk-\u0041...
    assert json.loads(raw)["text"] == "pay sk-ABCDEFGHIJKLMNOPQRSTUVWX"

    dispatch(h.ctx, 1, [ToolCallRequest(call_id="c1", name="echo", raw_arguments=raw)], UnitOfWork())
    h.store.settle()  # commit 1 was sent while the read-only call ran

    (insert,) = h.store.invocation_inserts()
    assert insert.arguments == {"text": "pay [REDACTED]"}
    proposed = next(e for e in h.store.all_events() if e.type == "tool.call.proposed")
    assert proposed.payload["arguments"] == {"text": "pay [REDACTED]"}
    assert "ABCDEFGHIJKLMNOPQRSTUVWX" not in json.dumps([e.payload for e in h.store.all_events()])
