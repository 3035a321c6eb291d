"""A typed tool named by `AGENTRT_TOOL_MODULES=tests.tool_modules.refunds`.

Each call the function receives is appended to the JSON-lines file named by
`REFUNDS_LOG` (what it was given: the model's class, its fields, the
context), so a test can tell whether and how it ran in another process.
"""

from __future__ import annotations

import json
import os

from pydantic import BaseModel, Field

from runs.tools import ToolExecutionContext, register


class Refund(BaseModel):
    """Refund part of an order."""

    order_id: str = Field(pattern=r"^ord_[0-9]{1,12}$")
    amount_cents: int = Field(gt=0, le=100_000)
    reason: str = Field("", max_length=200)


class RefundDone(BaseModel):
    refund_id: str
    order_id: str
    amount_cents: int


@register(name="issue_refund", read_only=False, side_effect="external_write", timeout_seconds=10)
def issue_refund(args: Refund, ctx: ToolExecutionContext) -> RefundDone:
    """Refund part of an order (once per idempotency key)."""
    with open(os.environ["REFUNDS_LOG"], "a") as log:
        log.write(
            json.dumps(
                {
                    "type": type(args).__name__,
                    "args": args.model_dump(),
                    "run_id": str(ctx.run_id),
                    "step": ctx.step,
                    "attempt": ctx.attempt,
                    "idempotency_key": ctx.idempotency_key,
                    "cancelled": ctx.cancelled.is_set(),
                    "has_deadline": ctx.deadline is not None,
                }
            )
            + "\n"
        )
    return RefundDone(refund_id=f"re_{ctx.idempotency_key[:8]}", order_id=args.order_id, amount_cents=args.amount_cents)
