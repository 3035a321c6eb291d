"""Resume: take over a RUNNING run whose lease expired,
record the interruption, and decide — by the configured reconciler or by
the unknown-outcome table — whether the run continues, pauses for an operator,
completes or fails. Resume ends through `finalize` like any execution.

The reclaim sweep, a `drive_run` that finds an expired lease and
`POST /api/runs/{id}/resume/` all use `run_resume`.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection
from django.utils.module_loading import import_string
from pydantic import BaseModel, ConfigDict

from approvals.hashing import INTERRUPTED_NOTICE, UNCERTAIN_NOTICE, request_hash, tool_spec_dict
from approvals.models import (
    INTERRUPTED_SIDE_EFFECT,
    RECONCILE,
    UNCERTAIN_SIDE_EFFECT,
    UNKNOWN_OUTCOME_KINDS,
    Approval,
)
from checkpoints.repository import checkpoint_current, checkpoint_latest
from runs.clock import CLOCK, IDS
from runs.domain.events import approval_requested, call_not_run, checkpointed
from runs.domain.pipeline import UNKNOWN_OUTCOME
from runs.domain.values import (
    ApprovalStatus,
    FailureReason,
    ModelCallStatus,
    ModelUsage,
    OutcomeKind,
    RunFailure,
    RunLimits,
    RunOutcome,
    RunUsage,
    Suspension,
    SuspensionKind,
)
from runs.domain.writes import ApprovalInsert, EventWrite, InvocationUpdate, UnitOfWork
from runs.errors import RunLeased, RunNotFound, RunNotRunning
from runs.models import AgentVersion, ModelCall, Run, ToolInvocation
from runs.runtime.faults import fire
from runs.runtime.finalize import finalize_detached
from runs.runtime.liveness import LIVENESS
from runs.runtime.long_calls import settle_tasks
from runs.runtime.queue import Claim, run_heartbeat, worker_identity
from runs.services.selectors import run_to_dict
from runs.store import lease
from runs.tools import REGISTRY
from runs.tools.mcp.tools import shown_by, tools_for
from runs.tools.reconcile import by_tool as reconcile_by_tool
from runs.tools.reconcile import covers as tool_reconcilers_cover

log = logging.getLogger("agentrt.resume")

MAX_LEASE_EXPIRATIONS = 3
INTERRUPTED_OBSERVATION = {
    "error": "interrupted",
    "message": (
        "the process stopped while this call was in flight; its result was not recorded. You may ask for it again."
    ),
}


UNCERTAIN_OBSERVATION = {
    "error": "outcome_unknown",
    "outcome": "uncertain",
    "message": "the request was sent and no answer came; whether it took effect is unknown.",
}


class RunView(BaseModel):
    """What a reconciler sees: copies of the run, its steps, its invocations
    and its approvals. Changing it changes nothing."""

    model_config = ConfigDict(frozen=True)

    run: dict[str, Any]
    steps: list[dict[str, Any]]
    invocations: list[dict[str, Any]]
    approvals: list[dict[str, Any]]


@dataclass
class Takeover:
    claim: Claim
    previous_owner: str | None
    previous_epoch: int
    interrupted: list[dict[str, Any]] = field(default_factory=list)


def run_resume(
    *,
    run_id: UUID | str,
    via: str = "api",
    seen_epoch: int | None = None,
    owner: str | None = None,
    dead_owner: str | None = None,
) -> str:
    """Resume a RUNNING run whose lease expired — or, with `dead_owner`, whose
    lease that owner holds though its process's session is gone
    (runs/runtime/liveness.py); return the outcome's kind (`continue`,
    `waiting`, `completed`, `failed`, `fenced`)."""
    try:
        rid = UUID(str(run_id))
    except ValueError:
        raise RunNotFound("no such run") from None
    row = Run.objects.filter(id=rid).values("status", "lease_epoch", "lease_expirations").first()
    if row is None:
        raise RunNotFound("no such run")
    if row["status"] != "RUNNING":
        raise RunNotRunning(f"the run is {row['status']}; only a RUNNING run can be resumed")
    takeover = take_over(
        run_id=rid,
        owner=owner or worker_identity(),
        seen_epoch=row["lease_epoch"] if seen_epoch is None else seen_epoch,
        via=via,
        dead_owner=dead_owner,
    )
    if takeover is None:
        raise RunLeased("another worker holds a live lease on this run")
    fire("resume.after_takeover", rid)
    return decide(takeover)


def take_over(*, run_id: UUID, owner: str, seen_epoch: int, via: str, dead_owner: str | None = None) -> Takeover | None:
    """One transaction: a new epoch (guarded by the epoch read, the expired
    lease and the status), `lease.taken_over`, and every in-flight step
    marked interrupted with its `step.interrupted` event."""
    now = CLOCK.now()

    def events(taken: lease.TakenOver) -> list[EventWrite]:
        taken_over = EventWrite(
            "lease.taken_over",
            {
                "previous_owner": taken.previous_owner,
                "previous_epoch": seen_epoch,
                "lease_owner": owner,
                "lease_epoch": taken.leased.epoch,
                "via": via,
                "lease_expirations": taken.lease_expirations,
            },
            now,
        )
        return [taken_over, *interrupted_events(taken, now)]

    LIVENESS.ensure(owner)  # this process's session holds its lock before it holds the lease
    taken = lease.take_over(
        run_id=run_id,
        owner=owner,
        seen_epoch=seen_epoch,
        lease_seconds=float(settings.AGENTRT_LEASE_SECONDS),
        now=now,
        read_observation=INTERRUPTED_OBSERVATION,
        unknown_outcome=UNKNOWN_OUTCOME,
        events=events,
        dead_owner=dead_owner,
    )
    if taken is None:
        return None
    claim = Claim(
        run_id=run_id,
        tenant_id=taken.leased.tenant_id,
        session_id=taken.leased.session_id,
        owner=owner,
        epoch=taken.leased.epoch,
    )
    return Takeover(
        claim=claim,
        previous_owner=taken.previous_owner,
        previous_epoch=seen_epoch,
        interrupted=[{"invocation": call.invocation, "step": call.step} for call in taken.effects],
    )


def interrupted_events(taken: lease.TakenOver, now) -> list[EventWrite]:
    """`step.interrupted` for each in-flight row a take-over (or a retry) marked interrupted."""
    out = [
        EventWrite("step.interrupted", {"step": step, "attempt": attempt, "phase": "deciding"}, now)
        for step, attempt in taken.model_calls
    ]
    for calls, read_only, outcome in ((taken.reads, True, "interrupted"), (taken.effects, False, "unknown")):
        for call in calls:
            out.append(
                EventWrite(
                    "step.interrupted",
                    {
                        "step": call.step,
                        "phase": "executing",
                        "invocation": str(call.invocation),
                        "call_id": call.call_id,
                        "tool": call.tool,
                        "read_only": read_only,
                        "outcome": outcome,
                    },
                    now,
                )
            )
    return out


def _failure(reason: FailureReason, error_class: str, message: str, **details) -> RunFailure:
    return RunFailure(reason=reason, error_class=error_class, message=message, occurred_at=CLOCK.now(), details=details)


# An unknown outcome: a side-effect call interrupted by a process that
# stopped, or one that ended `uncertain` in a live run (pipeline step 11).
UNKNOWN_STATUSES = ("interrupted", "uncertain")


def _unknown_outcomes(run_id):
    return ToolInvocation.objects.filter(
        run_id=run_id, status__in=UNKNOWN_STATUSES, read_only=False, result__isnull=True
    )


def settle_unknown(claim: Claim) -> str:
    """The live path of an uncertain side effect: the executing worker still
    holds `claim` (no takeover) and hands the decision to the same code a
    Resume uses — the reconciler, else an `uncertain_side_effect` pause."""
    return decide(Takeover(claim=claim, previous_owner=claim.owner, previous_epoch=claim.epoch))


def decide(takeover: Takeover) -> str:
    """Decide what the taken-over run does next and end through finalize."""
    claim = takeover.claim
    run = Run.objects.select_related("agent").get(id=claim.run_id)
    # Past the limit, a side effect whose outcome is unknown still gets its decision first (the operator's
    # park or the reconciler): failing the run over it would leave nobody asked whether the effect happened.
    # The limit fails the run at its next lost lease.
    unknown_first = _unknown_outcomes(run.id).exists()
    if run.lease_expirations > MAX_LEASE_EXPIRATIONS and not unknown_first:
        outcome = RunOutcome(
            kind=OutcomeKind.FAILED,
            failure=_failure(
                FailureReason.MAX_ATTEMPTS_EXCEEDED,
                "MaxAttemptsExceeded",
                f"the run lost its worker {run.lease_expirations} times; it will not be retried again",
            ),
        )
        return _end(claim, outcome, UnitOfWork())
    if not AgentVersion.objects.filter(agent_id=run.agent_id, version=run.agent_version).exists():
        outcome = RunOutcome(
            kind=OutcomeKind.FAILED,
            failure=_failure(
                FailureReason.AGENT_VERSION_MISSING,
                "AgentVersionMissing",
                f"agent {run.agent.name!r} has no version {run.agent_version[:12]}; the run is pinned to it and"
                " does not fall back to latest",
                agent=run.agent.name,
                agent_version=run.agent_version,
            ),
        )
        return _end(claim, outcome, UnitOfWork())
    damaged = _damaged(run)
    if damaged:
        outcome = RunOutcome(
            kind=OutcomeKind.FAILED,
            failure=_failure(
                FailureReason.INTERNAL_ERROR, "DamagedRecord", "a record of this run could not be read", damaged=damaged
            ),
        )
        return _end(claim, outcome, UnitOfWork())
    unknown = list(_unknown_outcomes(run.id).order_by("step_number", "call_index"))
    if unknown and settle_tasks(claim, unknown):  # an MCP task the server answers for is no unknown outcome
        unknown = list(_unknown_outcomes(run.id).order_by("step_number", "call_index"))
    if run.cancel_requested_at is not None and not unknown:
        # The operator asked to cancel and nothing is left undecided: end it.
        # With an unknown outcome the cancel waits for the decision below
        # ("the user cancelled" is no licence to lose whether the effect
        # happened); the run is cancelled when it resumes after it.
        return _end(claim, RunOutcome(kind=OutcomeKind.CANCELLED), UnitOfWork())
    if settings.AGENTRT_RECONCILER or tool_reconcilers_cover([inv.tool_name for inv in unknown]):
        return _reconcile(claim, run, unknown)
    if unknown:
        conflict = _cannot_wait(claim, unknown)
        if conflict is not None:
            return conflict
        return _pause(claim, run, unknown, kind=INTERRUPTED_SIDE_EFFECT)
    return _end(claim, RunOutcome(kind=OutcomeKind.YIELDED), UnitOfWork())


def _end(claim: Claim, outcome: RunOutcome, work: UnitOfWork) -> str:
    done = finalize_detached(claim, outcome, work, yield_reason="resume")
    return {
        OutcomeKind.YIELDED: "continue",
        OutcomeKind.SUSPENDED: "waiting",
        OutcomeKind.COMPLETED: "completed",
        OutcomeKind.FAILED: "failed",
        OutcomeKind.CANCELLED: "cancelled",
        OutcomeKind.FENCED: "fenced",
    }[done.kind]


def _damaged(run: Run) -> str | None:
    """Refuse to continue from a record that will not decode (no rewrite)."""

    try:
        RunLimits(**run.limits)
        RunUsage(**(run.usage or {}))
        AgentVersion.objects.get(agent_id=run.agent_id, version=run.agent_version)
        checkpoint_latest(run.id)
        for inv in _unknown_outcomes(run.id):
            if not isinstance(inv.arguments, dict):
                return f"invocation {inv.id}: arguments"
        return _damaged_model_call(run) or _damaged_approval(run)
    except Exception as exc:
        return type(exc).__name__
    return None


def _damaged_model_call(run: Run) -> str | None:
    """A model-call row whose status or usage will not decode (the usage rollup and the attempt numbering read them)."""
    for row in ModelCall.objects.filter(run_id=run.id).values("id", "status", "usage", "error"):
        try:
            ModelCallStatus(row["status"])
            if not isinstance(row["usage"], dict):
                raise TypeError("usage")
            ModelUsage(**row["usage"])
            if row["error"] is not None and not isinstance(row["error"], dict):
                raise TypeError("error")
        except Exception as exc:
            return f"model call {row['id']}: {type(exc).__name__}"
    return None


def _damaged_approval(run: Run) -> str | None:
    """An approval row whose status, kind, hash or shown content will not decode (the
    pipeline re-checks a decision against exactly these)."""
    kinds = {k for k, _ in Approval.KINDS}
    for row in Approval.objects.filter(run_id=run.id).values(
        "id", "status", "kind", "request_hash", "presentation", "capability"
    ):
        try:
            ApprovalStatus(row["status"])
            if row["kind"] not in kinds:
                raise ValueError("kind")
            if len(row["request_hash"] or "") != 64:
                raise ValueError("request_hash")
            if not isinstance(row["presentation"], dict) or not isinstance(row["capability"], dict):
                raise TypeError("presentation")
        except Exception as exc:
            return f"approval {row['id']}: {type(exc).__name__}"
    return None


def _expiry(run: Run, kind: str):
    """When an approval Resume writes expires: never for an unknown outcome's
    (interrupted, uncertain, or the reconciler's pause of one: every kind it
    writes) — no timer closes one, not the TTL, not the deadline."""
    if kind in UNKNOWN_OUTCOME_KINDS:
        return None
    expires = CLOCK.now() + timedelta(seconds=float(settings.AGENTRT_APPROVAL_TTL_SECONDS))
    if run.deadline_at and run.deadline_at < expires:
        expires = run.deadline_at
    return expires


def _tools_of(run_id) -> Any:
    """The run's tools as its version sees them: the registry, with the MCP tools it pins (runs.tools.mcp) —
    the spec an approval's hash is bound to, and which a changed server's tool no longer has."""
    pinned = Run.objects.filter(id=run_id).values_list("agent_id", "agent_version").first()
    definition = (
        AgentVersion.objects.filter(agent_id=pinned[0], version=pinned[1]).values_list("definition", flat=True).first()
        if pinned
        else None
    )
    return tools_for(definition)


def _pause(claim: Claim, run: Run, invocations: list[ToolInvocation], *, kind: str, pause: dict | None = None) -> str:
    """Pause the interrupted side effects on hash-bound approvals: finalize
    writes them, a full checkpoint, WAITING_FOR_APPROVAL and the lease release
    in one transaction."""
    now = CLOCK.now()
    late = run.deadline_at is not None and run.deadline_at <= now  # said by approval.requested (and its webhook)
    tools = _tools_of(run.id)
    work = UnitOfWork()
    approval_ids, inv_ids = [], []
    for inv in invocations:
        spec = tools.spec(inv.tool_name)
        # An uncertain call waits on its own kind unless the reconciler paused it.
        inv_kind = UNCERTAIN_SIDE_EFFECT if kind == INTERRUPTED_SIDE_EFFECT and inv.status == "uncertain" else kind
        presentation = {
            "tool": inv.tool_name,
            "arguments": inv.arguments,
            "side_effect": spec.side_effect if spec else inv.side_effect,
            "notice": UNCERTAIN_NOTICE if inv_kind == UNCERTAIN_SIDE_EFFECT else INTERRUPTED_NOTICE,
            "attempt": inv.attempt,
        }
        if inv_kind == UNCERTAIN_SIDE_EFFECT:
            presentation["error"] = inv.error
        presentation.update(shown_by(tools, inv.tool_name))  # an MCP tool's server and hints, as hints
        capability = {"tool": inv.tool_name, "arguments": inv.arguments}
        if pause is not None:
            # The reconciler's keys are kept, but what runs is always shown
            #: ours win for the tool, arguments and class.
            shown = {k: presentation[k] for k in ("tool", "arguments", "side_effect")}
            presentation = (
                {**dict(pause.get("presentation") or {}), **shown} if pause.get("presentation") else presentation
            )
            capability = dict(pause.get("capability") or {}) or capability
        approval_id = IDS.new_id()
        digest = request_hash(
            tenant_id=run.tenant_id,
            run_id=run.id,
            step_number=inv.step_number,
            invocation_id=inv.id,
            tool=tool_spec_dict(spec) if spec else None,
            arguments=inv.arguments,
            agent_version=run.agent_version,
            kind=inv_kind,
            presentation=presentation,
        )
        work.approval_inserts.append(
            ApprovalInsert(
                id=approval_id,
                invocation_id=inv.id,
                kind=inv_kind,
                request_hash=digest,
                capability=capability,
                presentation=presentation,
                expires_at=_expiry(run, inv_kind),
                created_at=now,
            )
        )
        work.invocation_updates.append(
            InvocationUpdate(id=inv.id, status=inv.status, suspended_kind=inv_kind, updated_at=now)
        )
        work.events.append(
            approval_requested(
                approval_id=approval_id,
                invocation_id=inv.id,
                kind=inv_kind,
                tool=inv.tool_name,
                request_hash=digest,
                step=inv.step_number,
                presentation=presentation,
                at=now,
                deadline_passed=late,
            )
        )
        approval_ids.append(approval_id)
        inv_ids.append(inv.id)
    state = checkpoint_current(run)
    state.pending_tool_calls = [
        {"invocation": str(i.id), "call_id": i.call_id, "name": i.tool_name} for i in invocations
    ]
    row = state.next_checkpoint("suspension", now, force_full=True)
    work.checkpoint = row
    work.events.append(checkpointed(row))
    outcome = RunOutcome(
        kind=OutcomeKind.SUSPENDED,
        suspension=Suspension(
            kind=SuspensionKind.APPROVAL, invocation_ids=inv_ids, approval_ids=approval_ids, details={"reason": kind}
        ),
    )
    return _end(claim, outcome, work)


def rerun_conflict(tool_name: str, arguments: Any, tools: Any = REGISTRY) -> tuple[str, bool] | None:
    """A call whose outcome is unknown can wait for an approval only
    while its tool is registered and its recorded arguments pass the tool's
    schema. Otherwise the reason it cannot, and whether the invocation ends
    `invalid_decision` (the schema case). Also used for `uncertain` calls."""
    if tools.spec(tool_name) is None:
        return f"tool {tool_name!r} is no longer registered", False
    if not isinstance(arguments, dict) or tools.validate(tool_name, arguments):
        return "the interrupted call's arguments no longer pass its schema", True
    return None


def _cannot_wait(claim: Claim, unknown: list[ToolInvocation]) -> str | None:
    """End the run `reconcile_conflict` when an unknown outcome has nothing
    valid to pause on (never an approval to re-run a call that cannot run)."""
    now = CLOCK.now()
    tools = _tools_of(claim.run_id)
    for inv in unknown:
        conflict = rerun_conflict(inv.tool_name, inv.arguments, tools)
        if conflict is None:
            continue
        message, invalid = conflict
        work = UnitOfWork()
        if invalid:
            failed = {"error": "invalid_decision", "message": "the arguments no longer pass the tool's schema"}
            work.invocation_updates.append(
                InvocationUpdate(id=inv.id, status="failed", result=failed, error=failed, updated_at=now)
            )
            work.events.append(
                call_not_run(invocation_id=inv.id, call_id=inv.call_id, tool=inv.tool_name, result=failed, at=now)
            )
        return _end(
            claim,
            RunOutcome(
                kind=OutcomeKind.FAILED,
                failure=_failure(
                    FailureReason.RECONCILE_CONFLICT, "ReconcileConflict", message, invocation=str(inv.id)
                ),
            ),
            work,
        )
    return None


def _view(run: Run) -> RunView:

    return RunView(
        run=run_to_dict(run),
        steps=[
            dict(r)
            for r in ModelCall.objects.filter(run_id=run.id)
            .order_by("step_number", "attempt_number")
            .values("step_number", "attempt_number", "status", "usage", "stop_reason")
        ],
        invocations=[
            {**r, "id": str(r["id"])}
            for r in ToolInvocation.objects.filter(run_id=run.id)
            .order_by("step_number", "call_index")
            .values(
                "id",
                "step_number",
                "call_id",
                "tool_name",
                "arguments",
                "status",
                "result",
                "error",
                "read_only",
                "side_effect",
                "idempotency_key",
                "attempt",
                "effect_sent_at",
                "outcome",
                "attempts",
            )
        ],
        approvals=[
            {**r, "id": str(r["id"])}
            for r in Approval.objects.filter(run_id=run.id).values("id", "kind", "status", "request_hash")
        ],
    )


class _Fenced(Exception):
    """The resumer lost its lease while the reconciler was thinking."""


def _call_reconciler(view: RunView, claim: Claim) -> Any:
    """Call the reconciler in a thread, outside any transaction, with
    AGENTRT_RECONCILE_TIMEOUT; keep the takeover's lease alive meanwhile."""
    box: dict[str, Any] = {}

    def target():
        try:
            fn = import_string(settings.AGENTRT_RECONCILER) if settings.AGENTRT_RECONCILER else reconcile_by_tool
            box["value"] = fn(view)
        except BaseException as exc:  # recorded, never raised into the worker
            box["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=target, name="reconciler", daemon=True)
    thread.start()
    timeout = float(settings.AGENTRT_RECONCILE_TIMEOUT)
    interval = max(0.05, float(settings.AGENTRT_LEASE_SECONDS) / 3)
    start = CLOCK.monotonic()
    while thread.is_alive():
        left = timeout - (CLOCK.monotonic() - start)
        if left <= 0:
            return TimeoutError("the reconciler did not answer in time")
        thread.join(min(interval, left))
        if thread.is_alive() and not run_heartbeat(run_id=claim.run_id, owner=claim.owner, epoch=claim.epoch).alive:
            return _Fenced()
    return box.get("error", box.get("value"))


ANSWER_KEYS = ("outcome", "result", "pause", "detail", "capability", "presentation")


def _as_dict(value: Any) -> dict | None:
    """A Reconciliation as a dict: a dict, a pydantic model, or any object
    carrying the keys as attributes (dataclass, slots, namedtuple, properties)."""
    if isinstance(value, dict):
        return value
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, (str, bytes, int, float, bool, list, tuple, set)) and not hasattr(value, "_fields"):
        return None
    found = {k: getattr(value, k) for k in ANSWER_KEYS if hasattr(value, k)}
    return found or None


def _usable_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
        return True
    except (TypeError, ValueError):
        return False


def _reconcile(claim: Claim, run: Run, unknown: list[ToolInvocation]) -> str:
    """Ask the configured reconciler (outside any transaction, with a timeout)
    and validate its answer against the reconciler contract."""

    def internal(message: str, **details) -> str:
        return _end(
            claim,
            RunOutcome(
                kind=OutcomeKind.FAILED,
                failure=_failure(FailureReason.INTERNAL_ERROR, "ReconcileError", message, **details),
            ),
            UnitOfWork(),
        )

    answer = _call_reconciler(_view(run), claim)
    if isinstance(answer, BaseException):
        if isinstance(answer, _Fenced):
            return _end(claim, RunOutcome(kind=OutcomeKind.FENCED), UnitOfWork())
        return internal(
            "the reconciler failed" if not isinstance(answer, TimeoutError) else "the reconciler timed out",
            exception_class=type(answer).__name__,
        )
    data = _as_dict(answer)
    if data is None:
        return internal("the reconciler returned something that is not a Reconciliation")
    outcome = data.get("outcome")
    if outcome == "continue":
        now = CLOCK.now()
        work = UnitOfWork()
        for inv in unknown:  # the agent sees the interrupted (or uncertain) observation
            observation = (
                INTERRUPTED_OBSERVATION if inv.status != "uncertain" else {**UNCERTAIN_OBSERVATION, "cause": inv.error}
            )
            work.invocation_updates.append(
                InvocationUpdate(id=inv.id, status=inv.status, result=observation, updated_at=now)
            )
        return _end(claim, RunOutcome(kind=OutcomeKind.YIELDED), work)
    if outcome == "completed":
        if "result" not in data or data["result"] is None or not _usable_json(data["result"]):
            return internal("the reconciler's completed result is not usable JSON")
        return _end(
            claim, RunOutcome(kind=OutcomeKind.COMPLETED, result=data["result"], final_message=None), UnitOfWork()
        )
    if outcome == "conflict":
        detail = str(data.get("detail") or "")[:2000]
        return _end(
            claim,
            RunOutcome(
                kind=OutcomeKind.FAILED,
                failure=_failure(
                    FailureReason.RECONCILE_CONFLICT,
                    "ReconcileConflict",
                    detail or "external state contradicts the record",
                ),
            ),
            UnitOfWork(),
        )
    if outcome == "waiting":
        pause = _as_dict(data.get("pause"))
        if (
            pause is None
            or pause.get("outcome") != "require_approval"
            or not _usable_json(pause.get("capability"))
            or not _usable_json(pause.get("presentation"))
            or not isinstance(pause.get("capability") or {}, dict)
            or not isinstance(pause.get("presentation") or {}, dict)
        ):
            return internal("the reconciler's pause is not a usable require_approval decision")
        if not unknown:
            return _end(
                claim,
                RunOutcome(
                    kind=OutcomeKind.FAILED,
                    failure=_failure(
                        FailureReason.RECONCILE_CONFLICT,
                        "ReconcileConflict",
                        "nothing was executing: there is nothing to pause",
                    ),
                ),
                UnitOfWork(),
            )
        conflict = _cannot_wait(claim, unknown)
        if conflict is not None:
            return conflict
        return _pause(claim, run, unknown, kind=RECONCILE, pause=pause)
    return internal("the reconciler returned an unknown outcome", outcome=str(outcome)[:50])
