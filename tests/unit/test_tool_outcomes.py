"""Pipeline step 11 (DESIGN §7, issue 11): every executed call is classified
succeeded, failed or uncertain; an uncertain side effect is not answered to
the model; a read-only uncertain call is a failed observation. No database."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest

from runs.domain.errors import OutcomeUnknown, ToolFailure
from runs.domain.loop import run_loop
from runs.domain.values import CancelReason, OutcomeKind
from tests.unit.fakes import ECHO, POST, START, build_context, echo_call, post_call


def tool_entries(h) -> list[dict]:
    return [m for m in h.ctx.state.conversation if m["role"] == "tool"]


def results(outcome):
    return [(e.type, e.payload.get("outcome")) for e in outcome.pending.events if e.type.startswith("tool.call.")]


def test_a_value_is_succeeded_and_a_tool_failure_is_failed():
    h = build_context([{"tool_calls": [post_call(1), post_call(2)]}, {"text": "ok"}])

    def post(arguments, context):
        if arguments["n"] == 2:
            raise ToolFailure("refused", "the upstream refused before anything happened")
        return {"posted": 1}

    h.tools.add(POST, post)
    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.COMPLETED
    updates = [u for w in h.store.written for u in w.invocation_updates]
    assert [(u.status, u.outcome) for u in updates] == [("completed", "succeeded"), ("failed", "failed")]
    # The first call's outcome went into the second call's watermark transaction, before it was sent.
    assert [u.id for u in h.store.watermarks[1].before.invocation_updates] == [updates[0].id]
    assert [u.attempts[-1]["outcome"] for u in updates] == ["succeeded", "failed"]
    assert updates[0].clear_error is True  # a completed call keeps no stale error
    assert [e["is_error"] for e in tool_entries(h)] == [False, True]


@pytest.mark.parametrize(
    "raised",
    [
        OutcomeUnknown("connection_lost", "sent, no answer"),
        ToolFailure("timeout", "no answer", uncertain=True),
        KeyError("a bug after the effect, maybe"),
    ],
)
def test_an_uncertain_side_effect_is_recorded_and_handed_over_without_a_result(raised):
    h = build_context([{"tool_calls": [post_call(1), post_call(2)]}, {"text": "never"}])

    def post(arguments, context):
        if arguments["n"] == 1:
            raise raised
        return {"posted": 2}

    h.tools.add(POST, post)
    outcome = run_loop(h.ctx)

    # The loop stops: the decision belongs to the reconciler or an operator.
    assert outcome.kind is OutcomeKind.UNKNOWN
    assert h.tools.count("post") == 1  # the rest of the batch waits, still authorized
    assert len(h.provider.requests) == 1  # the model was not asked again
    assert tool_entries(h) == []  # ... and saw no result for the call
    (update,) = outcome.pending.invocation_updates
    assert (update.status, update.outcome, update.result, update.attempt) == ("uncertain", "uncertain", None, 1)
    assert update.error["uncertain"] is True
    assert update.attempts == [{**update.attempts[0], "attempt": 1, "outcome": "uncertain"}]
    assert results(outcome) == [("tool.call.failed", "uncertain")]


def test_an_uncertain_read_only_call_is_a_failed_observation_the_model_sees():
    h = build_context([{"tool_calls": [echo_call("x")]}, {"text": "noted"}])

    def echo(arguments, context):
        raise OutcomeUnknown("timeout", "no answer in time")

    h.tools.add(ECHO, echo)
    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.COMPLETED
    (entry,) = tool_entries(h)
    assert entry["is_error"] and json.loads(entry["content"])["uncertain"] is True
    updates = [u for w in h.store.commits for u in w.invocation_updates]
    assert [(u.status, u.outcome) for u in updates] == [("failed", "uncertain")]
    assert len(h.provider.requests) == 2


def test_a_crash_in_a_read_only_tool_is_failed_not_uncertain():
    h = build_context([{"tool_calls": [echo_call("x")]}, {"text": "ok"}])
    h.tools.add(ECHO, lambda arguments, context: {}["missing"])
    run_loop(h.ctx)
    updates = [u for w in h.store.commits for u in w.invocation_updates]
    assert [(u.status, u.outcome) for u in updates] == [("failed", "failed")]


def test_a_call_refused_before_execution_is_failed():
    h = build_context([{"tool_calls": [{"name": "echo", "arguments": "{"}]}, {"text": "ok"}])
    run_loop(h.ctx)
    inserts = h.store.invocation_inserts()
    assert [(i.status, i.outcome) for i in inserts] == [("failed", "failed")]


def test_cancelled_while_an_effect_runs_and_uncertain_is_asked_about_before_the_run_ends():
    """A cancel does not close an unknown outcome: the call is handed over for
    a decision (UNKNOWN), the rest of the batch is cancelled with its result
    recorded, and the run ends only after the decision."""
    h = build_context([{"tool_calls": [post_call(1), post_call(2)]}, {"text": "never"}])

    def post(arguments, context):
        context.token.cancel(CancelReason.REQUESTED)
        assert context.cancelled and context.cancelled.is_set()
        raise OutcomeUnknown("timeout", "sent, no answer")

    h.tools.add(POST, post)
    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.UNKNOWN
    assert [(u.status, u.outcome) for u in outcome.pending.invocation_updates] == [
        ("uncertain", "uncertain"),
        ("cancelled", None),
    ]
    assert outcome.pending.invocation_updates[1].result["error"] == "cancelled"
    assert h.tools.count("post") == 1


def test_the_tool_context_carries_deadline_cancellation_and_the_design_names():
    seen = {}
    h = build_context([{"tool_calls": [post_call(1)]}, {"text": "ok"}], deadline_at=START + timedelta(seconds=90))

    def post(arguments, context):
        seen.update(
            step=context.step,
            step_number=context.step_number,
            key=context.idempotency_key,
            attempt=context.attempt,
            deadline=context.deadline,
            left=context.seconds_left(),
            budget=context.time_budget(),
            cancelled=bool(context.cancelled),
            principal=context.principal,
            run_id=context.run_id,
        )
        return {}

    h.tools.add(POST.model_copy(update={"timeout_seconds": 300.0}), post)
    run_loop(h.ctx)

    assert seen["step"] == seen["step_number"] == 1 and seen["attempt"] == 1 and seen["key"].endswith(":1:call_1_0")
    assert seen["deadline"] == START + timedelta(seconds=90)
    assert seen["left"] == 90.0 and seen["budget"] == 90.0  # the tool's 300 s are bounded by the deadline
    assert seen["cancelled"] is False and seen["principal"] is None


def test_the_cancel_signal_is_the_runs_cancellation_not_a_lost_lease():
    from runs.domain.cancellation import Token
    from runs.domain.pipeline import CancelSignal

    for reason, expected in (
        (CancelReason.REQUESTED, True),
        (CancelReason.DEADLINE, True),
        (CancelReason.FENCED, False),
    ):
        token = Token()
        signal = CancelSignal(token)
        assert not signal and signal.wait(0) is False
        token.cancel(reason)
        assert bool(signal) is expected and signal.wait(0.01) is expected


def test_a_side_effect_failing_because_the_cancellation_reached_it_is_uncertain_not_failed():
    h = build_context([{"tool_calls": [post_call(1)]}, {"text": "never"}])

    def post(arguments, context):
        context.token.cancel(CancelReason.REQUESTED)  # the cancel reaches the running tool
        raise ToolFailure("aborted", "stopped halfway")  # a plain failure: the tool does not say whether it acted

    h.tools.add(POST, post)
    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.UNKNOWN  # asked about first; the cancel waits for the decision
    assert [(u.status, u.outcome) for u in outcome.pending.invocation_updates] == [("uncertain", "uncertain")]


def test_a_tool_refusing_because_the_run_was_already_cancelled_is_failed():
    h = build_context([{"tool_calls": [post_call(1)]}, {"text": "never"}])
    calls = []

    def post(arguments, context):
        calls.append(1)
        raise ToolFailure("cancelled", "not sent")

    h.tools.add(POST, post)
    h.ctx = replace(
        h.ctx,
        fault=lambda point: h.ctx.token.cancel(CancelReason.REQUESTED) if point == "tool.after_watermark" else None,
    )
    outcome = run_loop(h.ctx)

    assert calls == [1] and outcome.kind is OutcomeKind.CANCELLED
    assert [(u.status, u.outcome) for u in outcome.pending.invocation_updates] == [("failed", "failed")]
