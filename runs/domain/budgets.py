"""The budget ledger: four scopes; recording usage and checking it are one step."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from runs.domain.errors import BudgetExceeded
from runs.domain.values import BudgetScope, FailureReason, ModelUsage, RunLimits, RunUsage

TIME_RESERVE_FRACTION = 0.2  # ADR-0209: the final fifth of the run's time ...
TIME_RESERVE_MAX_SECONDS = 60.0  # ... and never more than a minute


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
        new = usage.add_model(model_usage, calls=1)
        if over := self._over(new):
            exc = BudgetExceeded(FailureReason.BUDGET_EXCEEDED, f"the {over} limit was exceeded", dimension=over)
            exc.usage = new
            raise exc
        return new

    def _over(self, usage: RunUsage) -> str | None:
        """The first of cost, input tokens, output tokens that `usage` is over
        its limit in ("after" means record: strictly over), or None."""
        lim = self.limits
        if lim.max_cost_usd is not None and usage.cost_usd > lim.max_cost_usd:
            return "cost_usd"
        if lim.max_input_tokens is not None and usage.input_tokens > lim.max_input_tokens:
            return "input_tokens"
        if lim.max_output_tokens is not None and usage.output_tokens > lim.max_output_tokens:
            return "output_tokens"
        return None

    def fit_tool_batch(self, usage: RunUsage, requested: int) -> int:
        return max(0, min(requested, self.limits.max_tool_calls - usage.tool_calls))

    def child_caps(self, usage: RunUsage, count: int = 1) -> dict[str, int | float] | None:
        """Each child's share of what remains of this run's budget, when a
        batch starts `count` children at once: the remainder split evenly
        (whole steps and calls rounded down, money to the cent's millionth
        down), so the children's limits together never exceed what is left —
        they are reserved from it, not each given all of it. Usage
        is additive across delegation (`record_child_usage` adds what each
        child spent back at the join). None when a share would leave a child
        no step, no model call, no tokens or no money."""
        lim = self.limits
        count = max(1, count)
        caps: dict[str, int | float] = {
            "max_steps": (lim.max_steps - usage.steps) // count,
            "max_model_calls": (lim.max_model_calls - usage.model_calls) // count,
            "max_tool_calls": max(0, lim.max_tool_calls - usage.tool_calls) // count,
        }
        if lim.max_input_tokens is not None:
            caps["max_input_tokens"] = (lim.max_input_tokens - usage.input_tokens) // count
        if lim.max_output_tokens is not None:
            caps["max_output_tokens"] = (lim.max_output_tokens - usage.output_tokens) // count
        if lim.max_cost_usd is not None:
            caps["max_cost_usd"] = math.floor((lim.max_cost_usd - usage.cost_usd) / count * 1e8) / 1e8
        if min(v for k, v in caps.items() if k != "max_tool_calls") <= 0:
            return None
        return caps

    def record_child_usage(self, usage: RunUsage, child: RunUsage) -> RunUsage:
        """Add a child run's usage — tokens, cost, model calls, tool calls and
        steps — to this run's and check the limits, as one operation ("after"
        means record): raises BudgetExceeded (with the new usage) when the
        tokens or cost are over. A child's counters stay within its share
        (`child_caps`), so the counters' sum stays within this run's limits;
        the next step's checks see them."""
        new = usage.add_model(
            ModelUsage(
                input_tokens=child.input_tokens,
                output_tokens=child.output_tokens,
                cache_read_input_tokens=child.cache_read_input_tokens,
                cache_creation_input_tokens=child.cache_creation_input_tokens,
                reasoning_tokens=child.reasoning_tokens,
                cost_usd=child.cost_usd,
            ),
            calls=child.model_calls,
        ).model_copy(update={"tool_calls": usage.tool_calls + child.tool_calls, "steps": usage.steps + child.steps})
        if over := self._over(new):
            exc = BudgetExceeded(
                FailureReason.BUDGET_EXCEEDED,
                f"the {over} limit was exceeded by the usage of a child run",
                dimension=over,
            )
            exc.usage = new
            raise exc
        return new

    def time_reserve_starts_at(self) -> datetime | None:
        """ADR-0209: when a deadline-bound run with any synthesis reserve
        keeps the rest of its time for a tool-free answer — the final fifth
        of its time budget (`deadline_seconds`), at most 60 s; None when the
        run has no deadline or no reserve."""
        lim = self.limits
        if self.deadline_at is None or not lim.deadline_seconds:
            return None
        if not (
            lim.synthesis_reserve_steps
            or lim.synthesis_reserve_model_calls
            or lim.synthesis_reserve_tool_calls
            or lim.synthesis_reserve_cost_usd
        ):
            return None
        reserve = min(lim.deadline_seconds * TIME_RESERVE_FRACTION, TIME_RESERVE_MAX_SECONDS)
        return self.deadline_at - timedelta(seconds=reserve)

    def in_time_reserve(self, now: datetime) -> bool:
        start = self.time_reserve_starts_at()
        return start is not None and now >= start
