"""Delegation in the domain (issue 15 §1), with fakes: which `delegate_run`
calls start a child, what the suspension carries, the budget a child may
have, and the refund of an orchestration-only turn. No database."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from runs.domain.budgets import Ledger
from runs.domain.context import StepProgress
from runs.domain.errors import BudgetExceeded
from runs.domain.loop import run_loop
from runs.domain.pipeline import MAX_DELEGATION_DEPTH
from runs.domain.values import OutcomeKind, RunLimits, RunUsage, SuspensionKind, ToolSpec
from tests.unit.fakes import build_context, default_registry, echo_call

DELEGATE = ToolSpec(
    name="delegate_run",
    parameters={
        "type": "object",
        "properties": {"agent": {"type": "string", "minLength": 1}, "input": {"type": "string", "minLength": 1}},
        "required": ["agent", "input"],
        "additionalProperties": False,
    },
    read_only=True,
    control="delegate",
)


def delegate(agent: str, text: str = "go") -> dict:
    return {"name": "delegate_run", "arguments": {"agent": agent, "input": text}}


def harness(turns, *, delegates=("helper",), missing=(), depth=0, limits=None):
    tools = default_registry().add(DELEGATE, lambda arguments, context: pytest.fail("a control tool never runs"))
    h = build_context(turns, tools=tools, agent_tools=["echo", "delegate_run"], limits=limits)
    agent = replace(h.ctx.agent, delegates=tuple(delegates), delegates_missing=frozenset(missing))
    h.ctx = replace(h.ctx, agent=agent, run=replace(h.ctx.run, depth=depth))
    return h


def results(h) -> list[dict]:
    """The delegate_run results the model saw."""
    conv = h.ctx.state.conversation
    return [json.loads(m["content"]) for m in conv if m["role"] == "tool" and m["name"] == "delegate_run"]


def test_a_batch_of_delegate_calls_suspends_with_one_child_each_capped_by_its_share_of_what_remains():
    h = harness([{"tool_calls": [delegate("helper", "a"), delegate("helper", "b")]}], limits=RunLimits(max_steps=5))

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.SUSPENDED
    suspension = outcome.suspension
    assert suspension.kind is SuspensionKind.CHILD_RUN
    assert [(c.agent, c.input) for c in suspension.children] == [("helper", "a"), ("helper", "b")]
    assert [c.invocation_id for c in suspension.children] == suspension.invocation_ids
    assert len({c.run_id for c in suspension.children}) == 2
    caps = suspension.children[0].caps
    # two children split the rest: 5 steps (the turn refunded) -> 2 each, 24 model calls -> 12, 62 tool calls -> 31
    assert (caps["max_steps"], caps["max_model_calls"], caps["max_tool_calls"]) == (2, 12, 31)
    assert suspension.children[1].caps == caps
    assert [u.suspended_kind for u in outcome.pending.invocation_updates] == ["child_run", "child_run"]
    assert h.tools.calls == []


def test_a_call_for_an_agent_not_listed_is_a_failed_result_naming_it():
    h = harness([{"tool_calls": [delegate("intruder")]}, {"text": "ok"}], delegates=("helper", "other"))

    assert run_loop(h.ctx).kind is OutcomeKind.COMPLETED
    (result,) = results(h)
    assert result["error"] == "delegate_not_allowed"
    assert "'intruder'" in result["message"] and "helper, other" in result["message"]


def test_a_run_deep_in_delegation_may_not_delegate_further():
    h = harness([{"tool_calls": [delegate("helper")]}, {"text": "ok"}], depth=MAX_DELEGATION_DEPTH)

    assert run_loop(h.ctx).kind is OutcomeKind.COMPLETED
    assert results(h)[0]["error"] == "delegation_too_deep"


def test_a_run_one_level_above_the_limit_still_delegates():
    h = harness([{"tool_calls": [delegate("helper")]}], depth=MAX_DELEGATION_DEPTH - 1)
    assert run_loop(h.ctx).kind is OutcomeKind.SUSPENDED


def test_with_no_budget_left_for_a_child_the_call_fails_and_nothing_waits():
    h = harness([{"tool_calls": [delegate("helper"), echo_call("x")]}, {"text": "ok"}], limits=RunLimits(max_steps=1))

    outcome = run_loop(h.ctx)

    # step 1 was spent (its turn also called echo, so no refund): no step remains for a child; the run goes on
    # until the step budget stops it
    assert outcome.kind is OutcomeKind.FAILED and outcome.failure.reason == "max_steps_exceeded"
    assert results(h)[0]["error"] == "tool.budget_exhausted"


def test_an_orchestration_only_turn_is_refunded_and_a_mixed_turn_is_not():
    only = harness([{"tool_calls": [delegate("helper")]}])
    run_loop(only.ctx)
    mixed = harness([{"tool_calls": [delegate("helper"), echo_call("x")]}])
    run_loop(mixed.ctx)

    assert (only.ctx.progress.usage.steps, only.ctx.progress.usage.model_calls) == (0, 0)
    assert (mixed.ctx.progress.usage.steps, mixed.ctx.progress.usage.model_calls) == (1, 1)
    assert only.ctx.progress.usage.tool_calls == 1 and mixed.ctx.progress.usage.tool_calls == 2


def test_the_step_budget_sees_refunded_steps():
    progress = StepProgress(usage=RunUsage(steps=1), step_count=3)
    assert progress.charged_step(4) == 2  # two of the three steps were refunded
    assert StepProgress(usage=RunUsage(steps=3), step_count=3).charged_step(4) == 4


def test_child_caps_are_what_remains_and_none_when_nothing_does():
    ledger = Ledger(RunLimits(max_steps=4, max_model_calls=6, max_output_tokens=100, max_cost_usd=1.0), None)

    caps = ledger.child_caps(RunUsage(steps=1, model_calls=2, tool_calls=3, output_tokens=40, cost_usd=0.25))

    assert caps == {
        "max_steps": 3,
        "max_model_calls": 4,
        "max_tool_calls": 61,
        "max_output_tokens": 60,
        "max_cost_usd": 0.75,
    }
    assert ledger.child_caps(RunUsage(cost_usd=1.0)) is None
    assert ledger.child_caps(RunUsage(steps=4)) is None


def test_children_started_together_share_what_remains_and_never_exceed_it():
    """Six parallel children of a $1.00 parent: each may spend a sixth, so all
    six together spend at most the dollar (the review saw $2.70 when each
    was given the whole remainder)."""
    ledger = Ledger(RunLimits(max_steps=20, max_model_calls=30, max_output_tokens=1000, max_cost_usd=1.0), None)
    used = RunUsage(steps=2, model_calls=3, tool_calls=6, output_tokens=100, cost_usd=0.1)

    caps = ledger.child_caps(used, 6)

    assert caps == {
        "max_steps": 3,
        "max_model_calls": 4,
        "max_tool_calls": 9,
        "max_output_tokens": 150,
        "max_cost_usd": 0.15,
    }
    assert 6 * caps["max_cost_usd"] <= 1.0 - 0.1 and 6 * caps["max_steps"] <= 20 - 2
    assert ledger.child_caps(RunUsage(steps=15), 6) is None  # five steps left: no whole step for each of six


def test_a_childs_tokens_and_cost_are_recorded_on_the_parent_and_checked_in_one_step():
    ledger = Ledger(RunLimits(max_output_tokens=100), None)
    parent = RunUsage(output_tokens=50, model_calls=2, steps=2)

    child = RunUsage(output_tokens=30, input_tokens=7, model_calls=5, tool_calls=3, steps=4)
    after = ledger.record_child_usage(parent, child)
    # usage is additive across delegation: the child's counters join the parent's too
    assert (after.output_tokens, after.input_tokens, after.model_calls, after.tool_calls, after.steps) == (
        80,
        7,
        7,
        3,
        6,
    )

    with pytest.raises(BudgetExceeded) as info:
        ledger.record_child_usage(after, RunUsage(output_tokens=21))
    assert info.value.reason == "budget_exceeded" and info.value.usage.output_tokens == 101


def test_the_step_reserve_counts_charged_steps_only():
    """A run whose three steps include two refunded orchestration-only turns is at its second charged step:
    with 4 steps and a reserve of 1 it may still call tools."""
    from runs.domain.context_engine import synthesis_reason

    h = harness([{"text": "x"}], limits=RunLimits(max_steps=4, synthesis_reserve_steps=1))
    h.ctx.progress.step_count = 3
    h.ctx.progress.usage = RunUsage(steps=1)

    assert synthesis_reason(h.ctx, 4) is None
    h.ctx.progress.usage = RunUsage(steps=3)
    assert synthesis_reason(h.ctx, 4) == "steps"
