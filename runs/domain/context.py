"""The run context handed to `run_loop`, and the pure request builder."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from runs.domain.checkpoint import CheckpointState
from runs.domain.ports import (
    BudgetLedger,
    CancellationToken,
    Clock,
    IdFactory,
    LeaseMonitor,
    ModelProvider,
    PolicyEngine,
    RunStore,
    ToolRegistry,
)
from runs.domain.tracing import NullTracer
from runs.domain.values import ModelRequest, RunUsage
from runs.domain.writes import UnitOfWork


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8: the form every hash is taken over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass
class RunSnapshot:
    """The run row as the executing worker holds it."""

    id: UUID
    tenant_id: UUID
    session_id: UUID
    agent_name: str
    agent_version: str
    input: str
    usage: RunUsage
    step_count: int
    deadline_at: datetime | None
    attempts: int
    lease_epoch: int


@dataclass
class AgentSpec:
    name: str
    version: str
    instructions: str
    model: dict[str, Any]
    tools: list[str]
    policy: dict[str, Any]


@dataclass
class RunContext:
    run: RunSnapshot
    agent: AgentSpec
    state: CheckpointState
    clock: Clock
    ids: IdFactory
    provider: ModelProvider
    store: RunStore
    tools: ToolRegistry
    policy: PolicyEngine
    budgets: BudgetLedger
    token: CancellationToken
    lease: LeaseMonitor
    fault: Callable[[str], None]
    slice_seconds: float = 120.0
    draining: Callable[[], bool] = lambda: False
    started_monotonic: float = 0.0
    next_attempt: int = 1  # attempt number for the first model call of this execution
    prepared_call: tuple[int, int] | None = None  # (step, attempt) whose `started` row is committed
    resumed: bool = False
    approvals: Any = None  # the ApprovalGate port; None = require_approval fails closed
    pending: UnitOfWork = field(default_factory=UnitOfWork)  # writes not yet committed
    prepared_id: UUID | None = None
    current_step: int | None = None
    current_attempt: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    tracer: Any = field(default_factory=NullTracer)  # the Tracer port (seed 002's spans); no-op unless wired


def tool_schemas(ctx: RunContext) -> list[dict[str, Any]]:
    out = []
    for name in ctx.agent.tools:
        spec = ctx.tools.spec(name)
        if spec is not None:
            out.append({"name": spec.name, "description": spec.description, "parameters": spec.parameters})
    return out


def build_request(
    ctx: RunContext, step_number: int, attempt_number: int, *, tool_choice: str = "auto"
) -> tuple[ModelRequest, str]:
    """Build the model request from the checkpoint; pure, so two builds of one
    checkpoint are byte-identical. Return it with its `prefix_sha256`."""
    tools = tool_schemas(ctx) if tool_choice != "none" else []
    messages = ctx.state.conversation
    prefix = prefix_sha256(ctx, tools, messages)
    request = ModelRequest.model_construct(
        run_id=ctx.run.id,
        step_number=step_number,
        attempt_number=attempt_number,
        instructions=ctx.agent.instructions,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
    )
    return request, prefix


def prefix_sha256(ctx: RunContext, tools: list[dict[str, Any]], messages: list[dict[str, Any]]) -> str:
    """SHA-256 over the instructions, the tools and each message in order (a
    separator after each). A function of the content only; the running hash
    is kept between steps because the conversation only grows (compaction
    replaces the list, which starts a new one)."""
    head = canonical_json({"instructions": ctx.agent.instructions, "tools": tools})
    cache = ctx.extra.get("prefix")
    if cache is None or cache[0] is not messages or cache[1] != head or cache[2] > len(messages):
        hasher = hashlib.sha256(head.encode() + b"\x1e")
        done = 0
    else:
        _, _, done, hasher = cache
    for message in messages[done:]:
        hasher.update(canonical_json(message).encode() + b"\x1e")
    ctx.extra["prefix"] = (messages, head, len(messages), hasher)
    return hasher.copy().hexdigest()
