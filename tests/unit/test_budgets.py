"""The budget `Ledger`: four scopes, recording and checking usage."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from runs.domain.budgets import Ledger
from runs.domain.errors import BudgetExceeded
from runs.domain.values import BudgetScope, FailureReason, ModelUsage, RunLimits, RunUsage

NOW = datetime(2025, 1, 1, tzinfo=UTC)
ALL_SCOPES = list(BudgetScope)


def check(ledger, usage=RunUsage(), scope=BudgetScope.STEP, step=1, now=NOW):
    ledger.check(usage, scope, step_number=step, now=now)


@pytest.mark.parametrize("scope", ALL_SCOPES)
def test_a_passed_deadline_fails_every_scope(scope):
    ledger = Ledger(RunLimits(), NOW)

    with pytest.raises(BudgetExceeded) as info:
        check(ledger, scope=scope)
    assert info.value.reason is FailureReason.DEADLINE_EXCEEDED
    check(ledger, scope=scope, now=NOW - timedelta(seconds=1))


@pytest.mark.parametrize("scope", ALL_SCOPES)
def test_a_reached_cost_limit_fails_every_scope(scope):
    ledger = Ledger(RunLimits(max_cost_usd=1.0), None)

    with pytest.raises(BudgetExceeded) as info:
        check(ledger, RunUsage(cost_usd=1.0), scope)
    assert info.value.reason is FailureReason.BUDGET_EXCEEDED
    assert info.value.details == {"dimension": "cost_usd"}
    check(ledger, RunUsage(cost_usd=0.99), scope)


def test_max_steps_is_checked_at_step_scope_only():
    ledger = Ledger(RunLimits(max_steps=3), None)

    check(ledger, scope=BudgetScope.STEP, step=3)
    with pytest.raises(BudgetExceeded) as info:
        check(ledger, scope=BudgetScope.STEP, step=4)
    assert info.value.reason is FailureReason.MAX_STEPS_EXCEEDED
    for scope in (BudgetScope.ADMISSION, BudgetScope.ATTEMPT, BudgetScope.TOOL_CALL):
        check(ledger, scope=scope, step=4)


def test_model_calls_and_tokens_are_checked_at_attempt_scope_only():
    ledger = Ledger(RunLimits(max_model_calls=2, max_input_tokens=100, max_output_tokens=50), None)

    check(ledger, RunUsage(model_calls=1), BudgetScope.ATTEMPT)
    cases = [
        (RunUsage(model_calls=2), "model_calls"),
        (RunUsage(input_tokens=100), "input_tokens"),
        (RunUsage(output_tokens=50), "output_tokens"),
    ]
    for usage, dimension in cases:
        with pytest.raises(BudgetExceeded) as info:
            check(ledger, usage, BudgetScope.ATTEMPT)
        assert info.value.details == {"dimension": dimension}
        for scope in (BudgetScope.ADMISSION, BudgetScope.STEP, BudgetScope.TOOL_CALL):
            check(ledger, usage, scope)


def test_record_model_usage_adds_the_attempt_and_counts_the_call():
    ledger = Ledger(RunLimits(), None)
    usage = RunUsage(input_tokens=10, output_tokens=2, model_calls=1, cost_usd=0.1)

    new = ledger.record_model_usage(
        usage, ModelUsage(input_tokens=5, output_tokens=3, reasoning_tokens=1, cost_usd=0.2)
    )

    assert (new.input_tokens, new.output_tokens, new.reasoning_tokens, new.model_calls) == (15, 5, 1, 2)
    assert new.cost_usd == pytest.approx(0.3)
    assert usage.model_calls == 1  # value objects: the old totals are unchanged


@pytest.mark.parametrize(
    "limits, model_usage, dimension",
    [
        (RunLimits(max_cost_usd=0.5), ModelUsage(cost_usd=0.6), "cost_usd"),
        (RunLimits(max_input_tokens=10), ModelUsage(input_tokens=11), "input_tokens"),
        (RunLimits(max_output_tokens=10), ModelUsage(output_tokens=11), "output_tokens"),
    ],
)
def test_record_model_usage_over_a_limit_raises_with_the_new_totals(limits, model_usage, dimension):
    ledger = Ledger(limits, None)

    with pytest.raises(BudgetExceeded) as info:
        ledger.record_model_usage(RunUsage(), model_usage)

    assert info.value.details == {"dimension": dimension}
    assert info.value.usage.model_calls == 1


def test_record_model_usage_exactly_at_a_limit_is_accepted_then_the_next_attempt_is_refused():
    ledger = Ledger(RunLimits(max_output_tokens=10), None)

    new = ledger.record_model_usage(RunUsage(), ModelUsage(output_tokens=10))

    assert new.output_tokens == 10
    with pytest.raises(BudgetExceeded):
        check(ledger, new, BudgetScope.ATTEMPT)


@pytest.mark.parametrize("used, requested, fits", [(0, 3, 3), (62, 5, 2), (64, 1, 0), (70, 2, 0), (0, 0, 0)])
def test_fit_tool_batch_returns_what_the_remaining_budget_allows(used, requested, fits):
    ledger = Ledger(RunLimits(max_tool_calls=64), None)

    assert ledger.fit_tool_batch(RunUsage(tool_calls=used), requested) == fits
