"""The one table of run limits (the agent definition's `limits` keys).

Each limit is defined once here — its name, type, default and bounds — and
everything else derives from the table: the domain's `RunLimits` (defaults
and lower bounds), the agent definition's `limits` schema
(runs/services/agent_schema.py: lower and upper bounds, every key optional)
and the settings default `AGENTRT_DEFAULT_LIMITS`. No Django here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Limit:
    name: str
    type: type[int] | type[float]
    default: int | float | None  # None: unlimited unless the agent or the request sets it
    ge: int | float | None = None  # lower bound (inclusive)
    gt: int | float | None = None  # lower bound (exclusive)
    le: int | float | None = None  # the most an agent definition may ask for

    def bounds(self, *, upper: bool) -> dict[str, Any]:
        """The bounds as pydantic `Field` keywords (`upper`: with the definition's ceiling)."""
        out = {k: v for k, v in (("ge", self.ge), ("gt", self.gt)) if v is not None}
        if upper and self.le is not None:
            out["le"] = self.le
        return out


LIMITS: tuple[Limit, ...] = (
    Limit("max_steps", int, 32, ge=1, le=10_000),
    Limit("max_model_calls", int, 24, ge=1, le=10_000),
    Limit("max_tool_calls", int, 64, ge=0, le=100_000),
    Limit("max_input_tokens", int, None, ge=1),
    Limit("max_output_tokens", int, None, ge=1),
    Limit("max_cost_usd", float, None, ge=0),
    Limit("deadline_seconds", float, 3600, gt=0, le=30 * 86400),
    Limit("synthesis_reserve_steps", int, 0, ge=0),
    Limit("synthesis_reserve_model_calls", int, 2, ge=0),
    Limit("synthesis_reserve_tool_calls", int, 4, ge=0),
    Limit("synthesis_reserve_cost_usd", float, 0, ge=0),
)
BY_NAME: dict[str, Limit] = {limit.name: limit for limit in LIMITS}


def default_limits() -> dict[str, int | float | None]:
    """Every limit's default, by name: the value of `AGENTRT_DEFAULT_LIMITS`."""
    return {limit.name: limit.default for limit in LIMITS}
