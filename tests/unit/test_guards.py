"""The loop's remaining guards (issue 15 §2) on the domain core with fakes:
the tool-loop circuit breaker (ADR-0136), the deadline synthesis reserve
(ADR-0209) and the runtime carry (M7). Each section's first test was first
written against the code before the guard and showed today's behaviour
(commit "Tests that reproduce today's behaviour ..."): a looping model burnt
its steps to `max_steps_exceeded`, a deadline-bound run failed with no
answer, the checkpoint carried no working state."""

from __future__ import annotations

from datetime import timedelta

from runs.domain.breaker import IDENTICAL_CALL_LIMIT
from runs.domain.checkpoint import CheckpointState
from runs.domain.context import build_request
from runs.domain.context_engine import DEADLINE_INSTRUCTION, LOOP_INSTRUCTION
from runs.domain.loop import run_loop
from runs.domain.values import ModelTurn, OutcomeKind, RunLimits, StopReason, ToolSpec
from runs.domain.working_state import BatchDisposition, WorkingState, apply_runtime_carry, working_note
from runs.providers.scripted import ScriptedProvider
from tests.unit.fakes import START, FixedPolicy, build_context, default_registry, echo_call

NO_RESERVES = {
    "synthesis_reserve_steps": 0,
    "synthesis_reserve_model_calls": 0,
    "synthesis_reserve_tool_calls": 0,
    "synthesis_reserve_cost_usd": 0.0,
}


def invocations_of_step(h, step):
    return [i for i in h.store.invocation_inserts() if i.step_number == step]


# -- the tool-loop circuit breaker ----------------------------------------------------------------------------


def test_a_looping_model_is_stopped_tool_loop_detected_instead_of_burning_its_steps():
    # The scripted model replays its last turn: the same call, forever (before the breaker: max_steps_exceeded
    # after 8 model calls). Two runs of the call leave its count one below the limit: the third request is
    # synthesis-only; the model ignores it and asks again, and the breaker fails the run.
    h = build_context([{"tool_calls": [echo_call("same")]}], limits=RunLimits(max_steps=8, **NO_RESERVES))
    outcome = run_loop(h.ctx)
    assert outcome.kind is OutcomeKind.FAILED and outcome.failure.reason == "tool_loop_detected"
    assert outcome.failure.error_class == "ToolLoopDetected" and outcome.failure.details["tool"] == "echo"
    assert h.tools.count("echo") == IDENTICAL_CALL_LIMIT - 1
    assert len(h.provider.requests) == 3
    forced = h.provider.requests[2]
    assert forced.tool_choice == "none" and forced.tools == []
    assert forced.messages[-1] == {"role": "system", "content": LOOP_INSTRUCTION}
    assert invocations_of_step(h, 3) == []  # nothing of the looping turn was recorded or run


def test_the_forced_synthesis_turn_lets_the_model_answer():
    h = build_context([{"tool_calls": [echo_call("same")]}] * 2 + [{"text": "what I found"}])
    outcome = run_loop(h.ctx)
    assert outcome.kind is OutcomeKind.COMPLETED and outcome.final_message == "what I found"
    assert [r.tool_choice for r in h.provider.requests] == ["auto", "auto", "none"]


def test_a_batch_that_would_reach_the_limit_trips_the_breaker_before_anything_runs():
    h = build_context([{"tool_calls": [echo_call("x")] * IDENTICAL_CALL_LIMIT}, {"text": "never"}])
    outcome = run_loop(h.ctx)
    assert outcome.kind is OutcomeKind.FAILED and outcome.failure.reason == "tool_loop_detected"
    assert outcome.failure.details["count"] == IDENTICAL_CALL_LIMIT
    assert h.tools.count("echo") == 0 and invocations_of_step(h, 1) == []


def test_different_calls_never_trip_the_breaker():
    h = build_context([{"tool_calls": [echo_call(f"page {i}")]} for i in range(6)] + [{"text": "done"}])
    outcome = run_loop(h.ctx)
    assert outcome.kind is OutcomeKind.COMPLETED and h.tools.count("echo") == 6
    assert all(r.tool_choice == "auto" for r in h.provider.requests[:-1])


# -- the deadline synthesis reserve -------------------------------------------------------------------------


class Obedient:
    """A model that honours `tool_choice="none"` (as real ones do) and
    otherwise plays the script; `think` seconds pass on the clock per call."""

    def __init__(self, turns, clock=None, think=0.0):
        self.scripted = ScriptedProvider({"turns": turns})
        self.clock = clock
        self.think = think

    def complete(self, request, token):
        if self.clock is not None and self.think:
            self.clock.advance(self.think)
        if request.tool_choice == "none":
            return ModelTurn(text="answer from the evidence", stop_reason=StopReason.END_TURN)
        return self.scripted.complete(request, token)


def deadline_run(provider=None, tool_seconds=15.0):
    turns = [{"tool_calls": [echo_call(f"page {i}")]} for i in range(20)] + [{"text": "the answer"}]
    h = build_context(
        turns,
        provider=provider,
        limits=RunLimits(max_steps=30, deadline_seconds=100),  # the default reserves apply
        deadline_at=START + timedelta(seconds=100),
    )
    spec, _, validator = h.tools._tools["echo"]
    h.tools._tools["echo"] = (spec, lambda a, c: (h.clock.advance(tool_seconds), a["text"])[1], validator)
    return h


def test_a_deadline_bound_run_keeps_its_final_fifth_for_a_tool_free_answer():
    # Before the reserve: the same run failed deadline_exceeded with no answer. The reserve is 20 s of 100
    # (a fifth; at most 60 s): the request at t=90 is tool-free and the model answers before the deadline.
    h = deadline_run()
    h.provider.inner = Obedient(h.provider.inner.turns)
    outcome = run_loop(h.ctx)
    assert outcome.kind is OutcomeKind.COMPLETED and outcome.final_message == "answer from the evidence"
    last = h.provider.requests[-1]
    assert last.tool_choice == "none" and last.messages[-1] == {"role": "system", "content": DEADLINE_INSTRUCTION}
    assert h.clock.now() < START + timedelta(seconds=100)
    assert all(r.tool_choice == "auto" for r in h.provider.requests[:-1])


def test_the_reserve_is_at_most_sixty_seconds():
    h = build_context([{"text": "x"}], limits=RunLimits(deadline_seconds=3600), deadline_at=START + timedelta(hours=1))
    assert h.ctx.budgets.time_reserve_starts_at() == START + timedelta(seconds=3540)
    none = build_context([{"text": "x"}], limits=RunLimits(deadline_seconds=3600, **NO_RESERVES))
    assert none.ctx.budgets.time_reserve_starts_at() is None  # no deadline, no reserve


def test_a_model_that_ignores_the_time_synthesis_instruction_fails_visibly_without_dispatch():
    h = deadline_run()
    outcome = run_loop(h.ctx)
    assert outcome.kind is OutcomeKind.FAILED and outcome.failure.reason == "budget_exceeded"
    assert outcome.failure.error_class == "SynthesisReserveViolation"
    assert outcome.failure.details["dimension"] == "deadline"
    steps = len(h.provider.requests)
    assert invocations_of_step(h, steps) == [] and h.tools.count("echo") == steps - 1


def test_a_batch_arriving_after_the_reserve_began_gets_persisted_budget_refusals():
    # The request of step 6 leaves at t=75 (tools allowed); its answer arrives at t=85, inside the reserve.
    h = deadline_run(tool_seconds=10.0)
    h.provider.inner = Obedient(h.provider.inner.turns, clock=h.clock, think=5.0)
    outcome = run_loop(h.ctx)
    assert outcome.kind is OutcomeKind.COMPLETED and outcome.final_message == "answer from the evidence"
    refused = [i for i in h.store.invocation_inserts() if i.status == "failed"]
    assert len(refused) == 1 and refused[0].result["error"] == "tool.budget_exhausted"
    assert refused[0].result["dimension"] == "deadline"
    ran = h.tools.count("echo")
    assert ran == len(h.store.invocation_inserts()) - 1  # the refused call never ran ...
    assert h.ctx.progress.usage.tool_calls == ran  # ... and is not counted as usage
    assert h.provider.requests[-1].tool_choice == "none"


# -- the runtime carry ----------------------------------------------------------------------------------------


def batch_checkpoints(h):
    return [c for c in h.store.checkpoints() if c.trigger == "tool_batch"]


def test_the_checkpoint_carries_the_last_tool_error_and_the_builder_shows_it():
    # Before the carry: the checkpoint had no such fields.
    h = build_context([{"tool_calls": [{"name": "echo", "arguments": {}}]}, {"text": "done"}])
    run_loop(h.ctx)
    state = batch_checkpoints(h)[-1].state
    assert (state["step"], state["last_tool_error"], state["denials"], state["question_id"]) == (
        1,
        "schema_invalid",
        0,
        None,
    )
    note = h.provider.requests[1].messages[-1]
    assert note["role"] == "system" and "schema_invalid" in note["content"]
    assert all(m.get("role") != "system" for m in h.provider.requests[0].messages)


def test_a_batch_without_errors_clears_the_last_tool_error():
    h = build_context(
        [{"tool_calls": [{"name": "echo", "arguments": {}}]}, {"tool_calls": [echo_call("ok")]}, {"text": "done"}]
    )
    run_loop(h.ctx)
    assert [c.state["last_tool_error"] for c in batch_checkpoints(h)] == ["schema_invalid", None]
    assert all(m.get("role") != "system" for m in h.provider.requests[2].messages)


def test_consecutive_denials_are_carried_and_the_third_fails_repeated_denial():
    h = build_context([{"tool_calls": [echo_call(f"n{i}")]} for i in range(5)], policy=FixedPolicy({"echo": "deny"}))
    outcome = run_loop(h.ctx)
    assert outcome.kind is OutcomeKind.FAILED and outcome.failure.reason == "repeated_denial"
    assert [c.state["denials"] for c in batch_checkpoints(h)] == [1, 2]
    assert "1 more" in h.provider.requests[2].messages[-1]["content"]


def test_a_step_suspended_on_ask_user_carries_the_question_id():
    ask = ToolSpec(
        name="ask_user",
        parameters={"type": "object", "properties": {"question": {"type": "string"}}},
        read_only=True,
        control="ask_user",
    )
    tools = default_registry().add(ask, lambda a, c: None)
    h = build_context(
        [{"tool_calls": [{"name": "ask_user", "arguments": {"question": "which?"}}]}],
        tools=tools,
        agent_tools=["echo", "ask_user"],
    )
    outcome = run_loop(h.ctx)
    assert outcome.kind is OutcomeKind.SUSPENDED
    question = str(outcome.suspension.invocation_ids[0])
    assert h.ctx.state.question_id == question
    row = h.ctx.state.next_checkpoint("suspension", START, force_full=True)
    rebuilt = CheckpointState.materialise([(row.version, row.full, row.state)])
    assert rebuilt.working() == WorkingState(step=1, consecutive_denials=0, question_id=question)


def test_apply_runtime_carry_sets_exactly_its_four_fields():
    before = WorkingState(step=3, last_tool_error="x", consecutive_denials=2, question_id="q")
    after = apply_runtime_carry(before, BatchDisposition(error_codes=("a", "b"), all_denied=True), 4)
    assert after == WorkingState(step=4, last_tool_error="b", consecutive_denials=3, question_id=None)
    assert apply_runtime_carry(after, BatchDisposition(), 5) == WorkingState(step=5)
    assert working_note(WorkingState(step=5)) is None


def test_two_builds_of_a_checkpoint_with_working_state_are_byte_identical():
    h = build_context([{"tool_calls": [{"name": "echo", "arguments": {}}]}, {"text": "done"}])
    run_loop(h.ctx)
    first, p1 = build_request(h.ctx, 3, 1)
    second, p2 = build_request(h.ctx, 3, 2)
    assert p1 == p2 and first.messages == second.messages and "schema_invalid" in first.messages[-1]["content"]


# -- the worker's backoff -------------------------------------------------------------------------------------


def test_backoff_doubles_from_the_poll_interval_to_a_30_second_ceiling_and_resets():
    from runs.runtime.backoff import Backoff

    backoff = Backoff(0.5)
    assert [backoff.failed() for _ in range(9)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    backoff.succeeded()
    assert backoff.failed() == 0.5
