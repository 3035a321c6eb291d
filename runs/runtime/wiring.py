"""The composition root of the runtime: where the domain's ports get their adapters.

`build_context` wires one claimed run: the Django store, the tool registry
(with the MCP tools its version pins) and its tenant's allowed tools, the policy engine over the agent's policy
and its tenant's floor, the budget
ledger, the approval gate, the provider (streaming deltas through
`DeltaBatcher`), the supervisor as the lease, the fault hook. `connect_cluster`
wires the runtime into django-q2 (drain on stop, self-healing queues);
`connect_intents` gives each intent a commit may carry (runs.domain.writes)
its one handler. Nothing else in runs/runtime chooses an adapter.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from django.conf import settings
from django_q.signals import post_spawn

from approvals.gate import ApprovalGate
from approvals.policy import PersonFirst, PolicyEngine
from checkpoints.repository import checkpoint_current
from runs.clock import CLOCK, IDS
from runs.domain.budgets import Ledger
from runs.domain.cancellation import Token
from runs.domain.context import AgentSpec, RunContext, RunSnapshot, StepProgress
from runs.domain.errors import AgentVersionMissing, EndpointNotAllowed, WorkerFenced
from runs.domain.pipeline import MAX_DELEGATION_DEPTH
from runs.domain.scrub import scrub_stream
from runs.domain.values import CancelReason, RunLimits, RunUsage
from runs.domain.writes import EnqueueDeliveries, JoinParent, RingDoorbell, StartChildren, UnitOfWork, Wake
from runs.models import Agent, AgentVersion, ModelCall, Run, Tenant
from runs.providers import endpoint_name, provider_for, provider_streams
from runs.runtime import drain, qheal
from runs.runtime.children import child_ended, children_start
from runs.runtime.drain import draining
from runs.runtime.enqueue import enqueue_drive
from runs.runtime.faults import hook_for
from runs.runtime.principals import Revalidation, principal_for
from runs.runtime.queue import Claim
from runs.runtime.wake import waker
from runs.store import intents
from runs.store.lineage import RecordedCallsReader
from runs.store.reads import claimed_run
from runs.store.repository import DjangoRunStore
from runs.tools import REGISTRY
from runs.tools.mcp import tools_for
from webhooks import outbox

log = logging.getLogger("agentrt.executor")


def tenant_floor(tenant_id, step_of=None, store=None):
    """A reader of the tenant's policy floor. With `step_of` (the current step
    number) it is read once per step — one read for a whole batch of calls,
    and a tightened floor applies from the next step; without, at every call.
    With `store` (the run's `DjangoRunStore`), a step whose model request was
    started by a commit of that store takes the floor that commit read in its
    own transaction (`floor_seen`): no transaction of its own, so a read-only
    step stays at two commits; a SELECT otherwise (the first decisions after
    a resume). A failed read is not remembered (the engine fails closed and
    the next evaluation tries again)."""
    seen: dict = {}

    def read() -> dict:
        key = step_of() if step_of is not None else None
        if step_of is not None and seen and seen["step"] == key:
            return seen["floor"]
        captured = getattr(store, "floor_seen", None)
        if step_of is not None and captured is not None and captured[0] == key:
            seen.update(step=key, floor=captured[1])
            return seen["floor"]
        floor = Tenant.objects.filter(id=tenant_id).values_list("policy_floor", flat=True).first() or {}
        if step_of is not None:
            seen.update(step=key, floor=floor)
        return floor

    return read


def _read_only_of(tool_name: str) -> bool | None:
    spec = REGISTRY.spec(tool_name)
    return None if spec is None else bool(spec.read_only)


def _needs_person(tool_name: str) -> bool:
    """Whether a forked run's call waits for a person (`effects: "approve"`): it could touch the world."""
    spec = REGISTRY.spec(tool_name)
    return spec is None or not spec.read_only or spec.control == "delegate"


def ancestry(parent_id) -> tuple[int, list[dict]]:
    """How many parents a run has (0 for a run a person submitted) and their
    pinned versions' policies, nearest first: one read per ancestor, bounded
    by the depth delegation may reach. An ancestor whose version row is gone
    contributes a policy that asks for approval of everything (fail closed)."""
    depth, policies = 0, []
    while parent_id is not None and depth <= MAX_DELEGATION_DEPTH:
        depth += 1
        row = Run.objects.filter(id=parent_id).values_list("parent_id", "agent_id", "agent_version").first()
        if row is None:
            break
        parent_id, agent_id, version = row
        definition = (
            AgentVersion.objects.filter(agent_id=agent_id, version=version).values_list("definition", flat=True).first()
        )
        policies.append(
            (definition or {}).get("policy") or {} if definition is not None else {"default": "require_approval"}
        )
    return depth, policies


def build_context(claim: Claim, *, token: Token, lease, clock=CLOCK, ids=IDS) -> RunContext:
    run = claimed_run(claim.run_id)
    if run.cancel_requested_at is not None:
        # A cancel asked for before this execution (while an unknown outcome waited for its decision, or
        # before a takeover): observed from the first observation point, not the first heartbeat.
        token.cancel(CancelReason.REQUESTED)
    definition = run.pinned_definition  # the version the run is pinned to, never the latest
    if definition is None:  # its row is gone: the run fails `agent_version_missing`, never another version
        raise AgentVersionMissing(run.agent_name, run.agent_version)
    # The tenant's allow-lists as they are now (read with the run): an endpoint it no longer allows fails the
    # run before the model is called; its tools are checked at every call (the pipeline's `tool_allowed`).
    endpoint = endpoint_name(definition["model"])
    if endpoint is not None and run.allowed_endpoints is not None and endpoint not in run.allowed_endpoints:
        raise EndpointNotAllowed(endpoint)
    limits = RunLimits(**run.limits)
    first_lease = claim.epoch == 1  # every claim and takeover moves the epoch: no worker has run it before
    state = checkpoint_current(run, first_lease=first_lease)
    last_attempt = (
        None
        if first_lease
        else ModelCall.objects.filter(run_id=run.id, step_number=state.step + 1)
        .order_by("-attempt_number")
        .values_list("attempt_number", flat=True)
        .first()
    )
    depth, inherited = ancestry(run.parent_id) if run.parent_id is not None else (0, [])
    snapshot = RunSnapshot(
        id=run.id,
        tenant_id=run.tenant_id,
        session_id=run.session_id,
        agent_name=run.agent_name,
        agent_version=run.agent_version,
        input=run.input,
        deadline_at=run.deadline_at,
        attempts=run.attempts,
        lease_epoch=claim.epoch,
        parent_id=run.parent_id,
        depth=depth,
        principal=principal_for(run, username=run.principal_username),  # once per execution
    )
    delegates = tuple(definition.get("delegates") or ())
    policy = PolicyEngine(definition.get("policy"), read_only_of=_read_only_of, inherited=inherited)
    # A fork's side effects wait for a person unless it was asked to follow the policy (the engine stays the
    # one the floor is set on below; the wrapper asks it first).
    gated = PersonFirst(policy, needs_person=_needs_person) if run.fork_effects == "approve" else policy
    ctx = RunContext(
        run=snapshot,
        agent=AgentSpec(
            name=run.agent_name,
            version=run.agent_version,
            instructions=definition.get("instructions", ""),
            model=definition["model"],
            tools=list(definition.get("tools", [])),
            policy=definition.get("policy") or {},
            delegates=delegates,
            delegates_missing=frozenset(delegates)
            - set(Agent.objects.filter(tenant_id=run.tenant_id, name__in=delegates).values_list("name", flat=True))
            if delegates
            else frozenset(),
            allowed_tools=None if run.allowed_tools is None else frozenset(run.allowed_tools),
        ),
        state=state,
        clock=clock,
        ids=ids,
        provider=provider_for(definition["model"]),
        store=DjangoRunStore(
            run_id=run.id,
            tenant_id=run.tenant_id,
            session_id=run.session_id,
            owner=claim.owner,
            epoch=claim.epoch,
            code_version=settings.AGENTRT_CODE_VERSION,
        ),
        tools=tools_for(definition),  # the registry, with the MCP tools the version pins (runs.tools.mcp)
        policy=gated,
        budgets=Ledger(limits, run.deadline_at),
        token=token,
        lease=lease,
        fault=hook_for(run.id),
        slice_seconds=float(settings.AGENTRT_SLICE_SECONDS),
        model_attempts=int(settings.AGENTRT_MODEL_ATTEMPTS),
        draining=draining,
        started_monotonic=clock.monotonic(),
        resumed=state.version > 1 or run.attempts > 1,
        approvals=ApprovalGate(run=run, clock=clock, ids=ids),
        principals=Revalidation(),
        replay=RecordedCallsReader(run.replay_of_id) if run.replay_of_id is not None else None,
        progress=StepProgress(
            usage=RunUsage(**(run.usage or {})), step_count=run.step_count, next_attempt=(last_attempt or 0) + 1
        ),
    )
    policy.floor = tenant_floor(run.tenant_id, step_of=lambda: ctx.state.step, store=ctx.store)
    if provider_streams(definition["model"]):
        ctx = replace(ctx, provider=provider_for(definition["model"], on_delta=DeltaBatcher(ctx)))
    return ctx


class DeltaBatcher:
    """Text deltas of a streaming model call become `model.response.delta`
    events, batched (at most ~4 a second, or per 1 KiB), each in its own short
    fenced transaction — never a transaction held across the stream. A fenced
    flush sets the token, which aborts the stream."""

    MIN_INTERVAL = 0.25
    MAX_BUFFER = 1024

    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.raw: list[str] = []  # every delta of this attempt, as received
        self.shown = ""  # the scrubbed text already written as deltas
        self.size = 0  # characters received since the last flush
        self.last = ctx.clock.monotonic()
        self.key: tuple | None = None
        self.index = 0

    @staticmethod
    def bind(ctx: RunContext) -> None:
        """Point the provider's batcher at the context the loop runs with (the
        composition root replaces ports after the provider is built)."""
        batcher = getattr(ctx.provider, "on_delta", None)
        if isinstance(batcher, DeltaBatcher):
            batcher.ctx = ctx

    def __call__(self, text: str) -> None:
        key = (self.ctx.progress.current_step, self.ctx.progress.current_attempt)
        if key != self.key:
            self.key, self.index, self.raw, self.shown, self.size = key, 0, [], "", 0
        self.raw.append(text)
        self.size += len(text)
        now = self.ctx.clock.monotonic()
        if self.size >= self.MAX_BUFFER or now - self.last >= self.MIN_INTERVAL:
            self.flush(now)

    def flush(self, now: float) -> None:
        if not self.size:
            return
        self.size, self.last = 0, now
        # Scrubbed over the whole attempt so far, less a tail that may be a
        # half-arrived secret (it is shown once whole, or in the final turn).
        stable = scrub_stream("".join(self.raw))
        if not stable.startswith(self.shown) or len(stable) == len(self.shown):
            return  # nothing new that is safe to show (the final turn carries the whole text)
        text, self.shown = stable[len(self.shown) :], stable
        self.index += 1
        assert self.key is not None  # set by the delta that filled the buffer
        work = UnitOfWork()
        work.event(
            "model.response.delta",
            {"step": self.key[0], "attempt": self.key[1], "index": self.index, "text": text},
            self.ctx.clock.now(),
        )
        try:
            self.ctx.store.commit(work)
        except WorkerFenced:
            self.ctx.token.cancel(CancelReason.FENCED)


def connect_cluster() -> None:
    """Wire the runtime into django-q2 (called from the runs app's `ready`)."""
    post_spawn.connect(drain.install_worker_handlers, dispatch_uid="agentrt.drain")
    qheal.patch()  # first: the drain's stop wraps the supervised one
    drain.patch_sentinel()


def connect_intents() -> None:
    """What joins a commit: each intent type gets its one handler (called from
    the runs app's `ready`). The store runs them (runs.store.intents)."""
    intents.register(RingDoorbell, lambda cursor, i: enqueue_drive(i.run_id))
    intents.register(StartChildren, _start_children)
    intents.register(JoinParent, lambda cursor, i: child_ended(run_id=i.run_id, now=i.now))
    intents.register(EnqueueDeliveries, _enqueue_deliveries)
    intents.register_announced(outbox.wants)
    intents.register(Wake, lambda cursor, i: waker.wake(i.run_id, i.tenant_id))


def _start_children(cursor, intent: StartChildren) -> None:
    children_start(parent_id=intent.parent_id, suspension=intent.suspension, now=intent.now)


def _enqueue_deliveries(cursor, intent: EnqueueDeliveries) -> None:
    outbox.enqueue(
        cursor,
        tenant_id=intent.tenant_id,
        run_id=intent.run_id,
        events=list(intent.events),
        sequences=list(intent.sequences),
    )
