"""Context pressure, compaction and the synthesis reserve (context phases 3–5).

`build_with_pressure` measures before `build()`, compacts at most twice per
step (each compaction is a full checkpoint the loop adopts, with
`context.compacted`), and fails `context_overflow` beyond that. The
compactor never splits a tool call from its result: it folds whole older
steps into one summary item and keeps the first request and the latest steps
verbatim. `build()` stays pure, so two builds of one checkpoint are
byte-identical.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runs.domain.breaker import LOOP_SYNTHESIS, near_loop
from runs.domain.context import RunContext, build_request, canonical_json
from runs.domain.errors import BudgetExceeded
from runs.domain.values import FailureReason, ModelRequest

MAX_COMPACTIONS_PER_STEP = 2
OUTPUT_RESERVE = 0.15  # share of the window left for the answer
SUMMARY_CHARS_PER_ITEM = 160
SYNTHESIS_INSTRUCTION = (
    "[platform] The run is at its budget reserve. Do not call tools. Answer now, from the evidence already gathered "
    "in this conversation, and say plainly what is still unknown."
)
LOOP_INSTRUCTION = (
    "[platform] You have made the same tool call several times; it will not run again. Do not call tools. Answer "
    "now, from the evidence already gathered in this conversation, and say plainly what is still unknown."
)
DEADLINE_INSTRUCTION = (
    "[platform] The run is close to its deadline. Do not call tools. Answer now, from the evidence already "
    "gathered in this conversation, and say plainly what is still unknown."
)
DEADLINE_SYNTHESIS = "deadline"


def synthesis_instruction(reason: str) -> str:
    """The volatile instruction a synthesis-only request carries, by why it is synthesis-only."""
    if reason == LOOP_SYNTHESIS:
        return LOOP_INSTRUCTION
    if reason == DEADLINE_SYNTHESIS:
        return DEADLINE_INSTRUCTION
    return SYNTHESIS_INSTRUCTION


class ContextOverflow(BudgetExceeded):
    """The request does not fit even after two compactions; permanent."""

    def __init__(self, tokens: int, budget: int):
        super().__init__(
            FailureReason.CONTEXT_OVERFLOW,
            f"the request needs ~{tokens} tokens; the budget is {budget}",
            tokens=tokens,
            budget=budget,
        )


def estimate_tokens(value: Any) -> int:
    """A conservative estimator: ~4 characters per token of the canonical JSON."""
    return len(canonical_json(value)) // 4 + 1


def context_budget(ctx: RunContext) -> int:
    window = int(ctx.agent.model.get("context_window") or 0)
    if window <= 0:
        return 0  # unbounded: never compacts
    return int(window * (1 - OUTPUT_RESERVE))


# The canonical JSON of {"instructions": I, "messages": [...], "tools": T} is
# the request's head ({"instructions": I, "tools": T}) with the messages put in
# before the tools: these are the characters that differ.
_HEAD_TOOLS = len(',"tools":')
_MESSAGES_AND_TOOLS = len(',"messages":[') + len('],"tools":')


def measure(ctx: RunContext, request: ModelRequest) -> int:
    """`estimate_tokens` of the request's instructions, tools and messages.
    The conversation's part comes from the running prefix hash's count
    (`PrefixCache.chars`), which went on from the last message, so a step
    encodes only what is new, not the whole conversation (a 400-step run
    with 8 KiB results re-encoded 3 MB per step). Exact: equal to encoding
    the whole request (tests/unit/test_context_measure.py)."""
    cache = ctx.progress.prefix
    conversation = ctx.state.conversation
    messages = request.messages
    n = len(conversation)
    if (
        cache is None
        or cache.messages is not conversation
        or cache.done != n
        or cache.tools is not request.tools
        or cache.instructions is not request.instructions
        or len(messages) < n
        or (n and messages[n - 1] is not conversation[n - 1])
    ):
        return estimate_tokens({"instructions": request.instructions, "tools": request.tools, "messages": messages})
    chars = cache.chars + sum(len(canonical_json(extra)) for extra in messages[n:])
    if messages:
        chars += len(messages) - 1  # the commas between messages
    return (len(cache.head) - _HEAD_TOOLS + _MESSAGES_AND_TOOLS + chars) // 4 + 1


def _steps(conversation: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(start, end) index ranges of whole steps: an assistant item and the
    tool results that answer it; the first user item is not a step."""
    ranges = []
    i = 0
    while i < len(conversation):
        if conversation[i].get("role") == "assistant":
            j = i + 1
            while j < len(conversation) and conversation[j].get("role") == "tool":
                j += 1
            ranges.append((i, j))
            i = j
        else:
            i += 1
    return ranges


def _summarise(items: list[dict[str, Any]]) -> str:
    lines = []
    for item in items:
        role = item.get("role")
        if role == "assistant":
            for call in item.get("tool_calls") or []:
                lines.append(f"- called {call.get('name')}({str(call.get('arguments'))[:SUMMARY_CHARS_PER_ITEM]})")
            if item.get("content"):
                lines.append(f"- said: {str(item['content'])[:SUMMARY_CHARS_PER_ITEM]}")
        elif role == "tool":
            flag = "error" if item.get("is_error") else "result"
            lines.append(f"  {flag} of {item.get('name')}: {str(item.get('content'))[:SUMMARY_CHARS_PER_ITEM]}")
        elif role == "user" and item.get("summary"):
            lines.append(str(item.get("content"))[: SUMMARY_CHARS_PER_ITEM * 4])
        else:
            lines.append(f"- {role}: {str(item.get('content'))[:SUMMARY_CHARS_PER_ITEM]}")
    return "[summary of earlier steps]\n" + "\n".join(lines)


def compact(conversation: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Fold the older half of the steps (never the open one) into a summary;
    None when there is nothing left to fold."""
    steps = _steps(conversation)
    if len(steps) < 2:
        return None
    keep_from = steps[len(steps) // 2][0] if len(steps) > 2 else steps[-1][0]
    head_end = 1 if conversation and conversation[0].get("role") == "user" else 0
    folded = conversation[head_end:keep_from]
    if not folded:
        return None
    summary = {"role": "user", "content": _summarise(folded), "summary": True}
    return conversation[:head_end] + [summary] + conversation[keep_from:]


def synthesis_reason(ctx: RunContext, step_number: int) -> str | None:
    """The first reserve dimension the next request reaches, if any."""
    lim = ctx.budgets.limits
    usage = ctx.progress.usage
    if usage.tool_calls >= lim.max_tool_calls:
        return "tool_calls_exhausted"
    if near_loop(ctx):  # ADR-0136: a count one below the breaker's limit
        return LOOP_SYNTHESIS
    if ctx.budgets.in_time_reserve(ctx.clock.now()):  # ADR-0209: every attempt rechecks the clock
        return DEADLINE_SYNTHESIS
    if (
        lim.synthesis_reserve_model_calls
        and usage.model_calls + 1 + lim.synthesis_reserve_model_calls >= lim.max_model_calls
    ):
        return "model_calls"
    charged = ctx.progress.charged_step(step_number)  # refunded orchestration-only turns do not count
    if lim.synthesis_reserve_steps and charged + lim.synthesis_reserve_steps >= lim.max_steps:
        return "steps"
    if lim.synthesis_reserve_tool_calls and usage.tool_calls + lim.synthesis_reserve_tool_calls >= lim.max_tool_calls:
        return "tool_calls"
    if (
        lim.synthesis_reserve_cost_usd
        and lim.max_cost_usd is not None
        and usage.cost_usd + lim.synthesis_reserve_cost_usd >= lim.max_cost_usd
    ):
        return "cost_usd"
    return None


def build_with_pressure(
    ctx: RunContext, step_number: int, attempt: int, on_compact: Callable[[dict[str, Any]], None]
) -> tuple[ModelRequest, str, str | None]:
    """Phases 3–5: measure, compact if needed (at most twice), build.
    Return the request, its prefix hash and the synthesis dimension (if any)."""
    synthesis = synthesis_reason(ctx, step_number)
    tool_choice = "none" if synthesis else "auto"
    budget = context_budget(ctx)
    while True:
        with ctx.tracer.span(
            "context.build", {"step.number": step_number, "attempt.number": attempt}, under="step"
        ) as span:
            request, prefix = build_request(ctx, step_number, attempt, tool_choice=tool_choice)
            span.set("context.prefix_sha256", prefix)
        if synthesis:
            # Volatile: the instruction rides on this request only, never in a checkpoint.
            request = request.model_copy(
                update={
                    "messages": list(request.messages)
                    + [{"role": "system", "content": synthesis_instruction(synthesis)}]
                }
            )
        if not budget:
            return request, prefix, synthesis
        tokens = measure(ctx, request)
        if tokens <= budget:
            return request, prefix, synthesis
        compactions = ctx.progress.compactions.get(step_number, 0)
        if compactions >= MAX_COMPACTIONS_PER_STEP:
            raise ContextOverflow(tokens, budget)
        with ctx.tracer.span(
            "context.compact", {"step.number": step_number, "context.tokens_before": tokens}, under="step"
        ):
            folded = compact(ctx.state.conversation)
            if folded is None:
                raise ContextOverflow(tokens, budget)
            before = len(ctx.state.conversation)
            ctx.state.conversation = folded
            ctx.state.saved_len = 0  # the next checkpoint is full (trigger compaction)
            ctx.progress.compactions[step_number] = compactions + 1
            ctx.tracer.set_step("step.compactions", compactions + 1)
            on_compact(
                {
                    "reason": "pressure",
                    "step": step_number,
                    "tokens_before": tokens,
                    "budget": budget,
                    "items_before": before,
                    "items_after": len(folded),
                    "compaction": compactions + 1,
                }
            )


class SynthesisReserveViolation(BudgetExceeded):
    """The model called tools while the synthesis reserve forbade them; fails closed."""

    def __init__(self, dimension: str):
        super().__init__(
            FailureReason.BUDGET_EXCEEDED,
            f"the model called tools inside the synthesis reserve ({dimension})",
            dimension=dimension,
        )
