"""Fakes of the runtime core's ports, for unit tests with no database.

`build_context` wires them into a `RunContext` by hand, the way the executor's
composition root wires the real adapters.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from jsonschema import Draft202012Validator

from runs.domain.budgets import Ledger
from runs.domain.cancellation import Token
from runs.domain.checkpoint import CheckpointState
from runs.domain.context import AgentSpec, RunContext, RunSnapshot, StepProgress
from runs.domain.errors import PolicyChanged, WorkerFenced
from runs.domain.records import InvocationRecord
from runs.domain.values import ModelRequest, ModelTurn, RunLimits, RunUsage, ToolSpec
from runs.domain.writes import UnitOfWork
from runs.providers.scripted import ScriptedProvider

START = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
RUN_ID = uuid.UUID(int=0xA11CE)
TENANT_ID = uuid.UUID(int=0x7E7A7)
SESSION_ID = uuid.UUID(int=0x5E55)


class FakeClock:
    """`Clock` that stands still until told to `advance`; `sleep` advances it."""

    def __init__(self, start: datetime = START, monotonic_start: float = 1000.0):
        self._now = start
        self._mono = monotonic_start
        self.sleeps: list[float] = []

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)
        self._mono += seconds


class SequentialIds:
    """`IdFactory` returning UUID(int=1), UUID(int=2), ..."""

    def __init__(self, start: int = 1):
        self.n = start - 1

    def new_id(self) -> uuid.UUID:
        self.n += 1
        return uuid.UUID(int=self.n)


@dataclass
class Watermark:
    invocation_id: uuid.UUID
    attempt: int
    payload: dict[str, Any]
    at: datetime
    before: UnitOfWork | None = None  # the batch's earlier results, written in the watermark's transaction


class FakeStore:
    """`RunStore` that records every commit (a deep copy of its UnitOfWork, as
    it was at commit time) and every watermark, in one ordered `log`.

    `fence_on_commit=N` makes the N-th commit (1-based) raise `WorkerFenced`
    and record nothing; `fence_on_watermark=N` does the same for watermarks.
    """

    def __init__(
        self, *, fence_on_commit: int | None = None, fence_on_watermark: int | None = None, log: list | None = None
    ):
        self.commits: list[UnitOfWork] = []
        self.written: list[UnitOfWork] = []  # every unit in the order written: the commits and watermarks' `before`
        self.watermarks: list[Watermark] = []
        self.log: list[tuple[str, Any]] = log if log is not None else []
        self.fence_on_commit = fence_on_commit
        self.fence_on_watermark = fence_on_watermark
        self.commit_attempts = 0
        self.pending: FakeSent | None = None
        self.watermark_attempts = 0
        self.floor: dict[str, Any] = {}  # the tenant floor a watermark's transaction reads (`policy_check`)

    def commit(self, work: UnitOfWork) -> None:
        if self.pending is not None:
            self.pending.wait()
        self.commit_attempts += 1
        if self.fence_on_commit is not None and self.commit_attempts == self.fence_on_commit:
            self.log.append(("fenced", "commit"))
            raise WorkerFenced("fake: the fenced update affected zero rows")
        copied = copy.deepcopy(work)
        self.commits.append(copied)
        self.written.append(copied)
        self.log.append(("commit", len(self.commits)))

    def send(self, work: UnitOfWork) -> FakeSent:
        """Commit 1 in flight: recorded as sent, committed (or fenced) at
        `wait()`, which the next commit does first (as the real store)."""
        self.settle()
        self.log.append(("sent", len(self.commits) + 1))
        self.pending = FakeSent(self, copy.deepcopy(work))
        return self.pending

    def settle(self) -> None:
        if self.pending is not None:
            self.pending.wait()

    def mark_effect_sent(
        self,
        invocation_id,
        attempt: int,
        event_payload: dict[str, Any],
        at: datetime,
        *,
        before: UnitOfWork | None = None,
        policy_check: Any = None,
    ) -> None:
        if self.pending is not None:
            self.pending.wait()
        self.watermark_attempts += 1
        if self.fence_on_watermark is not None and self.watermark_attempts == self.fence_on_watermark:
            self.log.append(("fenced", "watermark"))
            raise WorkerFenced("fake: the watermark's fenced update affected zero rows")
        if policy_check is not None:
            decision = policy_check(self.floor)
            if decision not in ("allow", "require_approval"):
                raise PolicyChanged(decision)
        earlier = copy.deepcopy(before) if before is not None and not before.is_empty() else None
        if earlier is not None:  # the batch's earlier results, in the watermark's transaction
            self.written.append(earlier)
        self.watermarks.append(Watermark(invocation_id, attempt, copy.deepcopy(event_payload), at, earlier))
        self.log.append(("watermark", invocation_id))

    def invocations_for_step(self, step_number: int) -> list[InvocationRecord]:
        """The invocation rows of one step as the committed writes left them."""
        rows: dict[Any, dict[str, Any]] = {}
        for work in self.written:
            for i in work.invocation_inserts:
                if i.step_number == step_number:
                    rows[i.id] = {
                        "id": i.id,
                        "call_id": i.call_id,
                        "call_index": i.call_index,
                        "tool_name": i.tool_name,
                        "arguments": i.arguments,
                        "status": i.status,
                        "result": i.result,
                        "effect_sent_at": None,
                        "attempt": 0,
                        "read_only": i.read_only,
                        "idempotency_key": i.idempotency_key,
                    }
            for u in work.invocation_updates:
                if u.id in rows:
                    rows[u.id]["status"] = u.status
                    if u.result is not None:
                        rows[u.id]["result"] = u.result
                    if u.attempt is not None:
                        rows[u.id]["attempt"] = u.attempt
        for mark in self.watermarks:
            if mark.invocation_id in rows:
                rows[mark.invocation_id].update(status="executing", effect_sent_at=mark.at, attempt=mark.attempt)
        return [InvocationRecord(**r) for r in sorted(rows.values(), key=lambda r: r["call_index"])]

    # -- reading what was written -----------------------------------------
    def committed_event_types(self) -> list[list[str]]:
        return [[e.type for e in work.events] for work in self.commits]

    def all_events(self) -> list:
        return [e for work in self.written for e in work.events]

    def checkpoints(self) -> list:
        return [work.checkpoint for work in self.commits if work.checkpoint is not None]

    def model_call_inserts(self) -> list:
        return [m for work in self.commits for m in work.model_call_inserts]

    def invocation_inserts(self) -> list:
        return [i for work in self.commits for i in work.invocation_inserts]


class FakeSent:
    def __init__(self, store: FakeStore, work: UnitOfWork):
        self.store, self.work = store, work
        self.error: WorkerFenced | None = None

    def on_answer(self, fn) -> None:
        fn()

    def wait(self) -> None:
        if self.store.pending is not self:
            if self.error is not None:
                raise self.error
            return
        self.store.pending = None
        try:
            self.store.commit(self.work)
        except WorkerFenced as exc:
            self.error = exc
            raise


class FakeRegistry:
    """`ToolRegistry` over python callables `fn(arguments, context)`; records
    every execution in `calls` and in the shared `log`."""

    def __init__(self, log: list | None = None):
        self._tools: dict[str, tuple[ToolSpec, Callable, Draft202012Validator]] = {}
        self.calls: list[tuple[str, Any, Any]] = []
        self.log: list[tuple[str, Any]] = log if log is not None else []

    def add(self, spec: ToolSpec, fn: Callable[[Any, Any], Any]) -> FakeRegistry:
        Draft202012Validator.check_schema(spec.parameters)
        self._tools[spec.name] = (spec, fn, Draft202012Validator(spec.parameters))
        return self

    def spec(self, name: str) -> ToolSpec | None:
        entry = self._tools.get(name)
        return entry[0] if entry else None

    def unavailable(self, name: str) -> tuple[str, str] | None:
        return None

    def validate(self, name: str, arguments: Any) -> list[str]:
        entry = self._tools.get(name)
        if entry is None:
            return [f"unknown tool {name!r}"]
        return [e.message for e in entry[2].iter_errors(arguments)]

    def execute(self, name: str, arguments: Any, context: Any) -> Any:
        self.calls.append((name, arguments, context))
        self.log.append(("tool", name))
        return self._tools[name][1](arguments, context)

    def count(self, name: str) -> int:
        return sum(1 for n, _, _ in self.calls if n == name)


class AllowAll:
    """`PolicyEngine` that allows every call."""

    def evaluate(self, tool_name: str, arguments: Any) -> str:
        return "allow"

    def evaluate_under(self, tool_name: str, arguments: Any, floor: Any) -> str:
        return "allow"


class FixedPolicy:
    """`PolicyEngine` with a decision per tool name (default allow)."""

    def __init__(self, decisions: dict[str, str]):
        self.decisions = decisions

    def evaluate(self, tool_name: str, arguments: Any) -> str:
        return self.decisions.get(tool_name, "allow")

    def evaluate_under(self, tool_name: str, arguments: Any, floor: Any) -> str:
        return self.evaluate(tool_name, arguments)


class FakeLease:
    """`LeaseMonitor`; `answers` is a bool, or a list played in order (the
    last repeats)."""

    def __init__(self, answers: bool | list[bool] = True):
        self.answers = [answers] if isinstance(answers, bool) else list(answers)
        self.asked = 0

    def may_start_effect(self) -> bool:
        answer = self.answers[min(self.asked, len(self.answers) - 1)]
        self.asked += 1
        return answer


class RecordingProvider:
    """Wraps a provider and records every request it was asked to complete."""

    def __init__(self, inner):
        self.inner = inner
        self.requests: list[ModelRequest] = []

    def complete(self, request: ModelRequest, token) -> ModelTurn:
        # Copy the messages: the loop keeps appending to the same list.
        self.requests.append(request.model_copy(update={"messages": copy.deepcopy(request.messages)}))
        return self.inner.complete(request, token)


# -- tools ------------------------------------------------------------------

ECHO = ToolSpec(
    name="echo",
    description="Return the given text unchanged.",
    parameters={
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    },
    read_only=True,
)

POST = ToolSpec(
    name="post",
    description="A call with a side effect.",
    parameters={
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    },
    read_only=False,
    side_effect="external_write",
)


def echo_fn(arguments, context):
    return arguments["text"]


def echo_call(text: str) -> dict:
    return {"name": "echo", "arguments": {"text": text}}


def post_call(n: int) -> dict:
    return {"name": "post", "arguments": {"n": n}}


def default_registry(log: list | None = None) -> FakeRegistry:
    return FakeRegistry(log).add(ECHO, echo_fn).add(POST, lambda arguments, context: {"posted": arguments["n"]})


# -- the context ------------------------------------------------------------


@dataclass
class Harness:
    """A hand-built `RunContext` and the fakes behind it."""

    ctx: RunContext
    clock: FakeClock
    ids: SequentialIds
    store: FakeStore
    tools: FakeRegistry
    provider: RecordingProvider
    lease: FakeLease
    token: Token
    faults: list[str] = field(default_factory=list)
    seed_row: tuple[int, bool, dict] | None = None


def seed_state(text: str = "hello") -> tuple[CheckpointState, tuple[int, bool, dict]]:
    """Version 1, as `run_submit` writes it: the input, one full row."""
    state = CheckpointState(conversation=[{"role": "user", "content": text}])
    row = state.next_checkpoint("seed", START)
    return state, (row.version, row.full, row.state)


def build_context(
    turns: list[dict],
    *,
    tools: FakeRegistry | None = None,
    agent_tools: list[str] | None = None,
    limits: RunLimits | None = None,
    policy=None,
    store: FakeStore | None = None,
    lease: FakeLease | None = None,
    fault: Callable[[str, Harness], None] | None = None,
    provider=None,
    deadline_at: datetime | None = None,
    slice_seconds: float = 120.0,
) -> Harness:
    log: list = []
    clock = FakeClock()
    ids = SequentialIds()
    store = store or FakeStore(log=log)
    if store.log is not log:
        log = store.log
    tools = tools or default_registry(log)
    tools.log = log
    token = Token()
    lease = lease or FakeLease(True)
    state, seed_row = seed_state()
    limits = limits or RunLimits()
    recording = RecordingProvider(provider or ScriptedProvider({"turns": turns}))
    snapshot = RunSnapshot(
        id=RUN_ID,
        tenant_id=TENANT_ID,
        session_id=SESSION_ID,
        agent_name="tester",
        agent_version="v1",
        input="hello",
        deadline_at=deadline_at,
        attempts=1,
        lease_epoch=1,
    )
    harness = Harness(
        ctx=None,  # type: ignore[arg-type]  # set below: the fault hook needs the harness
        clock=clock,
        ids=ids,
        store=store,
        tools=tools,
        provider=recording,
        lease=lease,
        token=token,
        seed_row=seed_row,
    )

    def hook(point: str) -> None:
        harness.faults.append(point)
        if fault is not None:
            fault(point, harness)

    harness.ctx = RunContext(
        run=snapshot,
        agent=AgentSpec(
            name="tester",
            version="v1",
            instructions="Be brief.",
            model={"provider": "scripted", "turns": turns},
            tools=list(agent_tools if agent_tools is not None else ["echo", "post"]),
            policy={},
        ),
        state=state,
        clock=clock,
        ids=ids,
        provider=recording,
        store=store,
        tools=tools,
        policy=policy or AllowAll(),
        budgets=Ledger(limits, deadline_at),
        token=token,
        lease=lease,
        fault=hook,
        slice_seconds=slice_seconds,
        started_monotonic=clock.monotonic(),
        progress=StepProgress(usage=RunUsage()),
    )
    return harness
