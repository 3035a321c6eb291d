"""`run_loop` with fakes: step order, commits per step, model failures,
limits, slices and fencing. No database."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from uuid import UUID

import pytest

from runs.domain.checkpoint import CheckpointState
from runs.domain.errors import WorkerFenced
from runs.domain.loop import run_loop
from runs.domain.values import (
    CancelReason,
    FailureReason,
    ModelTurn,
    OutcomeKind,
    RunLimits,
    StopReason,
)
from tests.unit.fakes import ECHO, START, FakeRegistry, FakeStore, build_context, echo_call, echo_fn

THREE_STEPS = [
    {"tool_calls": [echo_call("one")]},
    {"tool_calls": [echo_call("two")]},
    {"text": "done"},
]


def test_three_step_run_completes_with_the_final_text():
    h = build_context(THREE_STEPS)

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.COMPLETED
    assert outcome.final_message == "done"
    assert outcome.failure is None
    assert h.tools.count("echo") == 2
    assert [a for a, _, _ in h.tools.calls] == ["echo", "echo"]
    assert h.ctx.progress.usage.tool_calls == 2
    assert h.ctx.progress.usage.model_calls == 3
    assert h.ctx.progress.usage.steps == 3
    assert h.ctx.state.step == 3
    assert h.ctx.progress.prepared_call is None  # nothing left for finalize to abandon


def test_three_step_run_events_come_in_step_order_grouped_by_commit():
    h = build_context(THREE_STEPS)

    outcome = run_loop(h.ctx)

    decide = ["model.response.completed", "run.checkpointed", "tool.call.proposed", "tool.call.authorized"]
    results = ["tool.call.completed", "run.checkpointed", "model.request.started"]
    assert h.store.committed_event_types() == [
        ["run.started", "model.request.started"],
        decide,
        results,
        decide,
        results,
    ]
    # The last step's response is left for finalize to commit with the transition.
    assert [e.type for e in outcome.pending.events] == ["model.response.completed"]


def test_each_read_only_step_costs_two_commits_plus_one_to_start():
    """For N echo steps the loop commits 1 + 2N times; finalize commits the rest."""
    for n in (1, 2, 5):
        turns = [{"tool_calls": [echo_call(f"t{i}")]} for i in range(n)] + [{"text": "done"}]
        h = build_context(turns)

        outcome = run_loop(h.ctx)

        assert outcome.kind is OutcomeKind.COMPLETED
        assert len(h.store.commits) == 1 + 2 * n, n
        assert h.store.watermarks == []


def test_the_next_step_model_call_row_rides_in_the_results_commit():
    h = build_context(THREE_STEPS)

    outcome = run_loop(h.ctx)

    inserts = [(m.step_number, m.attempt_number) for m in h.store.model_call_inserts()]
    assert inserts == [(1, 1), (2, 1), (3, 1)]
    # Step 2 and 3's `started` rows are in the commits that carry the previous results.
    assert [m.step_number for m in h.store.commits[2].model_call_inserts] == [2]
    assert [m.step_number for m in h.store.commits[4].model_call_inserts] == [3]
    finishes = [f for w in h.store.commits for f in w.model_call_finishes] + outcome.pending.model_call_finishes
    assert [f.status for f in finishes] == ["completed"] * 3
    assert [f.id for f in finishes] == [m.id for m in h.store.model_call_inserts()]
    assert all(f.prefix_sha256 and len(f.prefix_sha256) == 64 for f in finishes)


def test_same_script_with_fake_clock_and_ids_commits_identical_writes():
    first, second = build_context(THREE_STEPS), build_context(THREE_STEPS)

    a, b = run_loop(first.ctx), run_loop(second.ctx)

    assert first.store.commits == second.store.commits
    assert a.pending == b.pending
    ids = [m.id for m in first.store.model_call_inserts()] + [i.id for i in first.store.invocation_inserts()]
    assert sorted(ids) == [UUID(int=n) for n in range(1, 6)]


def test_the_model_sees_the_tool_results_of_the_previous_step():
    h = build_context(THREE_STEPS)

    run_loop(h.ctx)

    second = h.provider.requests[1].messages
    assert second[0] == {"role": "user", "content": "hello"}
    assert second[1]["role"] == "assistant"
    assert second[1]["tool_calls"] == [{"id": "call_1_0", "name": "echo", "arguments": '{"text": "one"}'}]
    assert second[2] == {
        "role": "tool",
        "tool_call_id": "call_1_0",
        "name": "echo",
        "content": "one",
        "is_error": False,
    }
    assert [r.step_number for r in h.provider.requests] == [1, 2, 3]
    assert h.provider.requests[0].tools[0]["name"] == "echo"


def test_checkpoint_chain_written_by_the_loop_materialises_to_the_conversation():
    h = build_context(THREE_STEPS)

    run_loop(h.ctx)

    rows = [h.seed_row] + [(c.version, c.full, c.state) for c in h.store.checkpoints()]
    assert [r[0] for r in rows] == [1, 2, 3, 4, 5]
    assert [c.base_version for c in h.store.checkpoints()] == [1, 1, 1, 1]
    rebuilt = CheckpointState.materialise(rows)
    assert rebuilt is not None
    # Everything but the final answer, which only finalize's checkpoint holds.
    assert rebuilt.conversation == h.ctx.state.conversation[: h.ctx.state.saved_len]
    assert h.ctx.state.conversation[h.ctx.state.saved_len :] == [
        {"role": "assistant", "content": "done", "tool_calls": []}
    ]
    assert rebuilt.step == 2


def test_run_started_names_the_epoch_and_a_resumed_run_says_resumed():
    h = build_context([{"text": "hi"}])
    run_loop(h.ctx)
    first = h.store.commits[0].events[0]
    assert first.type == "run.started"
    assert first.payload == {"lease_epoch": 1, "attempts": 1, "checkpoint_version": 1}

    h = build_context([{"text": "hi"}])
    h.ctx = replace(h.ctx, resumed=True)
    run_loop(h.ctx)
    assert h.store.commits[0].events[0].type == "run.resumed"


# -- limits ---------------------------------------------------------------------


def test_max_steps_reached_fails_max_steps_exceeded():
    h = build_context([{"tool_calls": [echo_call("again")]}], limits=RunLimits(max_steps=2))

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.FAILED
    assert outcome.failure.reason is FailureReason.MAX_STEPS_EXCEEDED
    assert outcome.failure.error_class == "BudgetExceeded"
    assert outcome.failure.step_number == 3
    assert len(h.provider.requests) == 2
    # No `started` row was prepared for the step that may not run.
    assert [m.step_number for m in h.store.model_call_inserts()] == [1, 2]
    assert len(h.store.commits) == 5


def test_model_call_budget_stops_before_the_next_attempt():
    h = build_context([{"tool_calls": [echo_call("x")]}, {"text": "never"}], limits=RunLimits(max_model_calls=1))

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.FAILED
    assert outcome.failure.reason is FailureReason.BUDGET_EXCEEDED
    assert outcome.failure.details == {"dimension": "model_calls"}
    assert len(h.provider.requests) == 1


def test_output_token_budget_exceeded_by_a_response_fails_the_run():
    h = build_context([{"text": "long", "usage": {"output_tokens": 50}}], limits=RunLimits(max_output_tokens=10))

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.FAILED
    assert outcome.failure.reason is FailureReason.BUDGET_EXCEEDED
    assert outcome.failure.details == {"dimension": "output_tokens"}
    assert h.ctx.progress.usage.output_tokens == 50  # the attempt's usage is recorded anyway
    assert [f.status for f in outcome.pending.model_call_finishes] == ["completed"]


def test_deadline_passed_during_a_step_fails_deadline_exceeded():
    h = build_context(
        [{"tool_calls": [echo_call("slow")]}, {"text": "late"}],
        deadline_at=START + timedelta(seconds=10),
        limits=RunLimits(deadline_seconds=10),  # as submitted: deadline_at is created_at + deadline_seconds
    )

    def slow_echo(arguments, context):
        h.clock.advance(60)
        return arguments["text"]

    h.tools.add(ECHO, slow_echo)

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.FAILED
    assert outcome.failure.reason is FailureReason.DEADLINE_EXCEEDED
    assert len(h.provider.requests) == 1


def test_slice_end_yields_without_preparing_the_next_call():
    h = build_context([{"tool_calls": [echo_call("slow")]}, {"text": "next slice"}], slice_seconds=30)

    def slow_echo(arguments, context):
        h.clock.advance(31)
        return arguments["text"]

    h.tools.add(ECHO, slow_echo)

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.YIELDED
    assert outcome.pending.is_empty()
    assert h.ctx.progress.prepared_call is None
    assert [m.step_number for m in h.store.model_call_inserts()] == [1]
    assert len(h.provider.requests) == 1


def test_draining_worker_yields_at_the_step_boundary():
    h = build_context([{"tool_calls": [echo_call("a")]}, {"text": "b"}])
    flag = {"drain": False}
    h.ctx = replace(h.ctx, draining=lambda: flag["drain"])

    def echo_then_drain(arguments, context):
        flag["drain"] = True
        return arguments["text"]

    h.tools.add(ECHO, echo_then_drain)

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.YIELDED
    assert len(h.provider.requests) == 1


# -- model failures -----------------------------------------------------------


def test_empty_turns_are_retried_three_times_then_fail_empty_model_turn():
    h = build_context([{"empty": True}])

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.FAILED
    assert outcome.failure.reason is FailureReason.EMPTY_MODEL_TURN
    assert outcome.failure.attempt_number == 3
    assert [(r.step_number, r.attempt_number) for r in h.provider.requests] == [(1, 1), (1, 2), (1, 3)]
    failed = [e for e in h.store.all_events() + outcome.pending.events if e.type == "model.response.failed"]
    assert [e.payload["error_class"] for e in failed] == ["EmptyModelTurn"] * 3
    assert len(h.store.commits) == 3  # one `started` row per attempt


def test_an_empty_turn_then_text_completes_on_the_second_attempt():
    h = build_context([{"attempts": [{"empty": True}, {"text": "there"}]}])

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.COMPLETED
    assert outcome.final_message == "there"
    assert [r.attempt_number for r in h.provider.requests] == [1, 2]


def test_a_transient_error_then_success_completes_on_attempt_two():
    h = build_context([{"attempts": [{"error": "transient"}, {"text": "recovered"}]}])

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.COMPLETED
    assert outcome.final_message == "recovered"
    assert [(m.step_number, m.attempt_number) for m in h.store.model_call_inserts()] == [(1, 1), (1, 2)]
    assert h.ctx.progress.usage.model_calls == 2
    failed = [e for e in h.store.all_events() if e.type == "model.response.failed"]
    assert [(e.payload["attempt"], e.payload["transient"]) for e in failed] == [(1, True)]
    finishes = [f.status for w in h.store.commits for f in w.model_call_finishes] + [
        f.status for f in outcome.pending.model_call_finishes
    ]
    assert finishes == ["failed", "completed"]


def test_three_transient_errors_fail_dependency_unavailable():
    h = build_context([{"error": "transient"}])

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.FAILED
    assert outcome.failure.reason is FailureReason.DEPENDENCY_UNAVAILABLE
    assert outcome.failure.error_class == "ScriptedTransientError"
    assert outcome.failure.attempt_number == 3
    assert len(h.provider.requests) == 3


def test_a_permanent_error_fails_model_permanent_error_without_retry():
    h = build_context([{"error": "permanent"}])

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.FAILED
    assert outcome.failure.reason is FailureReason.MODEL_PERMANENT_ERROR
    assert outcome.failure.error_class == "ScriptedPermanentError"
    assert len(h.provider.requests) == 1


def test_max_tokens_text_without_tool_calls_completes_with_the_truncated_text():
    h = build_context([{"text": "the answer is trunc", "stop_reason": "max_tokens"}])

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.COMPLETED
    assert outcome.final_message == "the answer is trunc"
    assert [f.stop_reason for f in outcome.pending.model_call_finishes] == ["max_tokens"]
    assert len(h.provider.requests) == 1


def test_max_tokens_with_no_text_is_not_an_empty_turn():
    h = build_context([{"stop_reason": "max_tokens"}])

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.COMPLETED
    assert outcome.final_message == ""
    assert len(h.provider.requests) == 1


# -- cancellation and fencing around the model call -------------------------------


class _CancellingProvider:
    """Answers with text, but the token is set while the call is in flight."""

    def __init__(self, reason: CancelReason):
        self.reason = reason

    def complete(self, request, token):
        token.cancel(self.reason)
        return ModelTurn(text="too late", stop_reason=StopReason.END_TURN)


def test_cancel_during_the_model_call_discards_the_answer_and_cancels():
    h = build_context([], provider=_CancellingProvider(CancelReason.REQUESTED))

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.CANCELLED
    assert [f.status for f in outcome.pending.model_call_finishes] == ["failed"]
    assert not any(e.type == "model.response.completed" for e in outcome.pending.events)


def test_deadline_token_during_the_model_call_fails_deadline_exceeded():
    h = build_context([], provider=_CancellingProvider(CancelReason.DEADLINE))

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.FAILED
    assert outcome.failure.reason is FailureReason.DEADLINE_EXCEEDED


def test_a_cancel_after_the_attempts_row_is_committed_sends_nothing_to_the_model():
    """Observation point 2: the token is read again after the attempt's
    `started` row commits and before the request is built and sent."""

    def cancel_at_the_second_call(point, h):
        if point == "model.before_call" and h.faults.count(point) == 2:
            h.token.cancel(CancelReason.REQUESTED)

    h = build_context(THREE_STEPS, fault=cancel_at_the_second_call)

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.CANCELLED
    assert len(h.provider.requests) == 1  # step 1's only: step 2's attempt was never sent


def test_token_set_before_the_run_starts_calls_no_model():
    h = build_context([{"text": "never"}])
    h.token.cancel(CancelReason.REQUESTED)

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.CANCELLED
    assert h.provider.requests == []
    assert h.store.commits == []


@pytest.mark.parametrize("nth", [1, 2, 3])
def test_fenced_commit_propagates_worker_fenced_out_of_run_loop(nth):
    store = FakeStore(fence_on_commit=nth)
    h = build_context(THREE_STEPS, store=store)

    with pytest.raises(WorkerFenced):
        run_loop(h.ctx)

    assert len(h.store.commits) == nth - 1
    if nth == 1:
        assert h.provider.requests == []  # the model is not called without its `started` row
    if nth == 1:
        assert h.tools.calls == []
    if nth == 2:
        # Commit 1 was in flight while the read-only echo ran (running it again
        # is harmless); fenced at its acknowledgement, nothing of it is kept.
        assert h.tools.count("echo") == 1
        assert h.store.log[-3:] == [("sent", 2), ("tool", "echo"), ("fenced", "commit")]
    if nth == 3:
        assert h.tools.count("echo") == 1
        assert len(h.provider.requests) == 1


def test_a_side_effect_runs_only_after_its_decision_is_committed():
    store = FakeStore(fence_on_commit=2)
    h = build_context([{"tool_calls": [{"name": "post", "arguments": {"n": 7}}]}, {"text": "x"}], store=store)

    with pytest.raises(WorkerFenced):
        run_loop(h.ctx)

    assert h.tools.calls == []  # commit 1 is not sent ahead of a side effect: it was fenced, nothing ran
    assert h.store.watermarks == []
    assert ("sent", 2) not in h.store.log


def test_a_batch_with_one_side_effect_is_not_overlapped():
    store = FakeStore(fence_on_commit=2)
    h = build_context(
        [{"tool_calls": [{"name": "echo", "arguments": {"text": "a"}}, {"name": "post", "arguments": {"n": 7}}]}],
        store=store,
    )

    with pytest.raises(WorkerFenced):
        run_loop(h.ctx)

    assert h.tools.calls == []  # not even the read-only echo: the batch holds a side effect


def test_fence_on_the_results_commit_carries_the_side_effect_outcome_as_late():
    store = FakeStore(fence_on_commit=3)
    h = build_context([{"tool_calls": [{"name": "post", "arguments": {"n": 7}}]}, {"text": "x"}], store=store)

    with pytest.raises(WorkerFenced) as info:
        run_loop(h.ctx)

    assert info.value.late is not None
    calls = info.value.late["calls"]
    assert [(c["tool"], c["is_error"], c["result"]) for c in calls] == [("post", False, {"posted": 7})]


def test_registry_outside_the_agents_tool_set_is_not_offered_to_the_model():
    tools = FakeRegistry().add(ECHO, echo_fn)
    h = build_context([{"text": "ok"}], tools=tools, agent_tools=["echo", "missing"])

    run_loop(h.ctx)

    assert [t["name"] for t in h.provider.requests[0].tools] == ["echo"]
