"""The tool-loop circuit breaker (one breaker, one counter).

The counter is the checkpoint's `identical_calls`: how many times each exact
call (tool name and canonical arguments) has run in this run. A batch that
leaves a count one below `IDENTICAL_CALL_LIMIT` puts the next request into
synthesis-only mode (no tools, an instruction to answer); a proposed call
that would reach the limit trips the breaker before anything of its batch is
recorded, and so does any tool call returned to that synthesis-only request.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from runs.domain.context import RunContext, canonical_json
from runs.domain.errors import ToolLoopDetected
from runs.domain.scrub import scrub
from runs.domain.values import ToolCallRequest

IDENTICAL_CALL_LIMIT = 3
LOOP_SYNTHESIS = "identical_calls"  # the synthesis dimension the breaker forces


def call_fingerprint(name: str, arguments: Any) -> str:
    """The identity of a call: its tool and its parsed, scrubbed arguments."""
    return hashlib.sha256(f"{name}\x1f{canonical_json(arguments)}".encode()).hexdigest()[:24]


def proposed_fingerprint(call: ToolCallRequest) -> str | None:
    """The fingerprint a proposed call will be counted under if it runs; None
    for arguments the pipeline refuses (they never run, so never count)."""
    raw = call.raw_arguments if isinstance(call.raw_arguments, str) else ""
    try:
        parsed = json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError):
        return None
    if not isinstance(parsed, dict):
        return None
    return call_fingerprint(call.name, scrub(parsed))


def near_loop(ctx: RunContext) -> bool:
    """Some call's count is one below the limit: the next request is synthesis-only."""
    counts = ctx.state.identical_calls
    return bool(counts) and max(counts.values()) >= IDENTICAL_CALL_LIMIT - 1


def trip(ctx: RunContext, calls: list[ToolCallRequest], *, synthesis: str | None) -> ToolLoopDetected | None:
    """The breaker's verdict on a model turn's calls: the error to fail the run
    with, or None. A call the agent has no such tool for never runs and is
    not counted; repeats inside the batch count like repeats across steps."""
    if synthesis == LOOP_SYNTHESIS and calls:
        fingerprint = proposed_fingerprint(calls[0])
        count = ctx.state.identical_calls.get(fingerprint, 0) + 1 if fingerprint else 1
        return ToolLoopDetected(calls[0].name, count, IDENTICAL_CALL_LIMIT, ignored_synthesis=True)
    seen: dict[str, int] = {}
    for call in calls:
        if call.name not in ctx.agent.tools:
            continue
        fingerprint = proposed_fingerprint(call)
        if fingerprint is None:
            continue
        seen[fingerprint] = seen.get(fingerprint, 0) + 1
        count = ctx.state.identical_calls.get(fingerprint, 0) + seen[fingerprint]
        if count >= IDENTICAL_CALL_LIMIT:
            return ToolLoopDetected(call.name, count, IDENTICAL_CALL_LIMIT)
    return None
