"""The budget ledger: four scopes; recording usage and checking it are one step."""

from __future__ import annotations

from datetime import datetime

from runs.domain.errors import BudgetExceeded
from runs.domain.values import BudgetScope, FailureReason, ModelUsage, RunLimits, RunUsage


class Ledger:
    """`BudgetLedger` over a run's limits and its pinned deadline."""

    def __init__(self, limits: RunLimits, deadline_at: datetime | None):
        self.limits = limits
        self.deadline_at = deadline_at

    def check(self, usage: RunUsage, scope: BudgetScope, *, step_number: int, now: datetime) -> None:
        lim = self.limits
        if self.deadline_at is not None and now >= self.deadline_at:
            raise BudgetExceeded(FailureReason.DEADLINE_EXCEEDED, "the run deadline has passed")
        if lim.max_cost_usd is not None and usage.cost_usd >= lim.max_cost_usd and usage.cost_usd > 0:
            raise BudgetExceeded(FailureReason.BUDGET_EXCEEDED, "the cost limit is reached", dimension="cost_usd")
        if scope is BudgetScope.STEP and step_number > lim.max_steps:
            raise BudgetExceeded(
                FailureReason.MAX_STEPS_EXCEEDED, f"the run reached its limit of {lim.max_steps} steps"
            )
        if scope is BudgetScope.ATTEMPT:
            if usage.model_calls + 1 > lim.max_model_calls:
                raise BudgetExceeded(
                    FailureReason.BUDGET_EXCEEDED,
                    f"the run reached its limit of {lim.max_model_calls} model calls",
                    dimension="model_calls",
                )
            self._check_tokens(usage)

    def _check_tokens(self, usage: RunUsage) -> None:
        lim = self.limits
        if lim.max_input_tokens is not None and usage.input_tokens >= lim.max_input_tokens:
            raise BudgetExceeded(
                FailureReason.BUDGET_EXCEEDED, "the input-token limit is reached", dimension="input_tokens"
            )
        if lim.max_output_tokens is not None and usage.output_tokens >= lim.max_output_tokens:
            raise BudgetExceeded(
                FailureReason.BUDGET_EXCEEDED, "the output-token limit is reached", dimension="output_tokens"
            )

    def record_model_usage(self, usage: RunUsage, model_usage: ModelUsage) -> RunUsage:
        new = usage.add_model(model_usage).model_copy(update={"model_calls": usage.model_calls + 1})
        lim = self.limits
        over = None
        if lim.max_cost_usd is not None and new.cost_usd > lim.max_cost_usd:
            over = "cost_usd"
        elif lim.max_input_tokens is not None and new.input_tokens > lim.max_input_tokens:
            over = "input_tokens"
        elif lim.max_output_tokens is not None and new.output_tokens > lim.max_output_tokens:
            over = "output_tokens"
        if over:
            exc = BudgetExceeded(FailureReason.BUDGET_EXCEEDED, f"the {over} limit was exceeded", dimension=over)
            exc.usage = new
            raise exc
        return new

    def fit_tool_batch(self, usage: RunUsage, requested: int) -> int:
        return max(0, min(requested, self.limits.max_tool_calls - usage.tool_calls))
