"""The loop's remaining guards (issue 15 §2) on the domain core with fakes:
the tool-loop circuit breaker, the deadline synthesis reserve and the
runtime carry."""

from __future__ import annotations

from datetime import timedelta

from runs.domain.loop import run_loop
from runs.domain.values import OutcomeKind, RunLimits
from tests.unit.fakes import START, build_context, echo_call

NO_RESERVES = {
    "synthesis_reserve_steps": 0,
    "synthesis_reserve_model_calls": 0,
    "synthesis_reserve_tool_calls": 0,
    "synthesis_reserve_cost_usd": 0.0,
}


def test_today_a_looping_model_burns_its_budget_to_max_steps():
    # The scripted model replays its last turn: the same call, forever.
    h = build_context([{"tool_calls": [echo_call("same")]}], limits=RunLimits(max_steps=8, **NO_RESERVES))
    outcome = run_loop(h.ctx)
    assert outcome.kind is OutcomeKind.FAILED and outcome.failure.reason == "max_steps_exceeded"
    assert len(h.provider.requests) == 8 and h.tools.count("echo") == 3


def test_today_a_deadline_bound_run_fails_with_no_answer():
    h = build_context(
        [{"tool_calls": [echo_call(f"page {i}")]} for i in range(20)] + [{"text": "the answer"}],
        limits=RunLimits(max_steps=30, deadline_seconds=100),
        deadline_at=START + timedelta(seconds=100),
    )
    slow = h.tools._tools["echo"]
    h.tools._tools["echo"] = (slow[0], lambda a, c: (h.clock.advance(15), a["text"])[1], slow[2])
    outcome = run_loop(h.ctx)
    assert outcome.kind is OutcomeKind.FAILED and outcome.failure.reason == "deadline_exceeded"
    assert outcome.final_message is None


def test_today_the_checkpoint_carries_no_runtime_working_state():
    h = build_context([{"tool_calls": [{"name": "echo", "arguments": {}}]}, {"text": "done"}])
    run_loop(h.ctx)
    batch = [c for c in h.store.checkpoints() if c.trigger == "tool_batch"][-1]
    assert "last_tool_error" not in batch.state and "question_id" not in batch.state
