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
    ApprovalGate,
    BudgetLedger,
    CancellationToken,
    Clock,
    IdFactory,
    LeaseMonitor,
    ModelProvider,
    PolicyEngine,
    PrincipalCheck,
    RecordedCalls,
    RunStore,
    ToolRegistry,
    Tracer,
)
from runs.domain.tracing import NullTracer
from runs.domain.values import ModelRequest, RunUsage
from runs.domain.working_state import working_note
from runs.domain.writes import UnitOfWork


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8: the form every hash is taken over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class RunSnapshot:
    """The run row as the executing worker claimed it: fixed for the slice.
    What changes while the loop runs (usage, step count) is in `StepProgress`."""

    id: UUID
    tenant_id: UUID
    session_id: UUID
    agent_name: str
    agent_version: str
    input: str
    deadline_at: datetime | None
    attempts: int
    lease_epoch: int
    principal: Any = None  # who the run acts for, when the composition root knows it
    parent_id: UUID | None = None  # a child run's parent
    depth: int = 0  # how many parents up to the run a person submitted


@dataclass(frozen=True)
class AgentSpec:
    name: str
    version: str
    instructions: str
    model: dict[str, Any]
    tools: list[str]
    policy: dict[str, Any]
    delegates: tuple[str, ...] = ()  # the agents `delegate_run` may start (the definition's `delegates`)
    delegates_missing: frozenset[str] = frozenset()  # those of them the tenant has no agent for (yet)
    # The tools the run's tenant allows now (`Tenant.allowed_tools`, read when the execution starts);
    # None: every tool. A call of a pinned tool outside it fails `tool_not_allowed`, never executed.
    allowed_tools: frozenset[str] | None = None

    def tool_allowed(self, name: str) -> bool:
        return self.allowed_tools is None or name in self.allowed_tools


@dataclass
class PrefixCache:
    """The running `prefix_sha256` of the conversation as last hashed: the
    conversation only grows between compactions, so the next hash goes on
    from where this one stopped."""

    messages: list[dict[str, Any]]
    head: str
    done: int
    hasher: Any  # a hashlib sha256 object
    tools: list[dict[str, Any]] | None = None  # the tool list `head` was encoded with
    instructions: str | None = None  # and the instructions
    chars: int = 0  # the length of the canonical JSON of messages[:done], each alone (context_engine.measure)


@dataclass
class StepProgress:
    """What changes while the loop runs: the running usage and step count,
    the writes not yet committed, which step and attempt are current, the
    model-call row already committed for the next step, and the caches the
    request builder keeps between steps."""

    usage: RunUsage = field(default_factory=RunUsage)
    step_count: int = 0
    pending: UnitOfWork = field(default_factory=UnitOfWork)  # writes not yet committed
    next_attempt: int = 1  # attempt number for the first model call of this execution
    prepared_call: tuple[int, int] | None = None  # (step, attempt) whose `started` row is committed
    prepared_id: UUID | None = None
    current_step: int | None = None
    current_attempt: int | None = None
    prefix: PrefixCache | None = None
    tool_schemas: list[dict[str, Any]] | None = None  # the pinned tool set's schemas, built once per slice
    compactions: dict[int, int] = field(default_factory=dict)  # per step number
    turn_event: Any = None  # the last `model.response.completed` written (it holds the turn's conversation item)

    def charged_step(self, step_number: int) -> int:
        """The step number the STEP budget sees: `step_number` less the
        orchestration-only turns refunded so far (such a turn does
        not consume the step budget). `usage.steps` counts charged steps, the
        run's `step_count` every step."""
        return step_number - max(0, self.step_count - self.usage.steps)


def _never() -> bool:
    return False


@dataclass(frozen=True)
class RunContext:
    """What `run_loop` is handed: fixed for the run's slice (the run, its
    agent, the ports, the slice's settings), plus two mutable parts the loop
    works on — `state` (the checkpointed conversation) and `progress` (what
    changes per step). The composition root swaps a port with
    `dataclasses.replace`, never by assignment."""

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
    model_attempts: int = 3  # attempts of one step's model call (AGENTRT_MODEL_ATTEMPTS)
    draining: Callable[[], bool] = _never
    started_monotonic: float = 0.0
    resumed: bool = False
    approvals: ApprovalGate | None = None  # None = require_approval fails closed
    principals: PrincipalCheck | None = None  # None = the principal is never revalidated
    replay: RecordedCalls | None = None  # a replay: every call answered from the original's record, none executed
    tracer: Tracer = field(default_factory=NullTracer)  # the run's spans; no-op unless wired
    progress: StepProgress = field(default_factory=StepProgress)


def tool_schemas(ctx: RunContext) -> list[dict[str, Any]]:
    """The schemas of the run's pinned tool set, built once per slice (the
    set does not change while the run executes). Shared: not to be mutated."""
    cached = ctx.progress.tool_schemas
    if cached is not None:
        return cached
    out = []
    for name in ctx.agent.tools:
        spec = ctx.tools.spec(name)
        if spec is not None:
            out.append({"name": spec.name, "description": spec.description, "parameters": spec.parameters})
    ctx.progress.tool_schemas = out
    return out


def build_request(
    ctx: RunContext, step_number: int, attempt_number: int, *, tool_choice: str = "auto"
) -> tuple[ModelRequest, str]:
    """Build the model request from the checkpoint; pure, so two builds of one
    checkpoint are byte-identical. Return it with its `prefix_sha256`."""
    tools = tool_schemas(ctx) if tool_choice != "none" else []
    messages = ctx.state.conversation
    prefix = prefix_sha256(ctx, tools, messages)
    note = working_note(ctx.state.working())  # the runtime carry, after the cached prefix
    if note:
        messages = list(messages) + [{"role": "system", "content": note}]
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
    cache = ctx.progress.prefix
    instructions = ctx.agent.instructions
    if cache is not None and cache.tools is tools and cache.instructions is instructions:
        head = cache.head  # the same tool list and instructions: their encoding is too
    else:
        head = canonical_json({"instructions": instructions, "tools": tools})
    if cache is None or cache.messages is not messages or cache.head != head or cache.done > len(messages):
        hasher = hashlib.sha256(head.encode() + b"\x1e")
        done, chars = 0, 0
    else:
        hasher, done, chars = cache.hasher, cache.done, cache.chars
    for message in messages[done:]:
        encoded = canonical_json(message)
        chars += len(encoded)
        hasher.update(encoded.encode() + b"\x1e")
    ctx.progress.prefix = PrefixCache(messages, head, len(messages), hasher, tools, instructions, chars)
    digest: str = hasher.copy().hexdigest()
    return digest
