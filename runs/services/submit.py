"""Run submission: validate, apply the Idempotency-Key, seed the checkpoint and ring `drive_run` in one transaction."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import IntegrityError, transaction
from pydantic import ValidationError

from checkpoints.models import Checkpoint
from checkpoints.repository import session_history
from ops.tracing import submit_context
from runs.clock import CLOCK, IDS
from runs.domain.checkpoint import CheckpointState
from runs.domain.context import canonical_json
from runs.domain.scrub import scrub_text
from runs.domain.writes import EventWrite
from runs.errors import ActiveRunExists, AgentNotFound, IdempotencyConflict, InvalidInput, QuotaExceeded, RunNotFound
from runs.models import TERMINAL, Agent, AgentVersion, Run, Session, Tenant
from runs.runtime.enqueue import enqueue_drive
from runs.services.agent_schema import Limits, resolve_limits
from runs.services.inputs import run_input
from runs.services.validation import check_text, pydantic_fields
from runs.store.auth import granted_permissions
from runs.store.cursor import pipelined, statement_cursor
from runs.store.events import append_events
from runs.store.reads import LatestVersion, active_runs_and_quota, latest_version


def _request_hash(agent: str, text: str, session: Any, limits: Any) -> str:
    return hashlib.sha256(
        canonical_json(
            {"agent": agent, "input": text, "session": str(session) if session else None, "limits": limits}
        ).encode()
    ).hexdigest()


def run_submit(
    *,
    tenant: Tenant,
    agent: str,
    input: str,
    session: UUID | str | None = None,
    limits: dict | None = None,
    idempotency_key: str | None = None,
    by: str = "",
    principal: Any = None,
) -> tuple[Run, bool]:
    """Create a run and ring `drive_run` in the same transaction.

    Return (run, created); a replay of the same Idempotency-Key and body
    returns the original run with created=False. Text sent to a session whose
    run waits for the user becomes that run's input (returned, created=False).
    `principal` is the submitting user (None: the system, e.g. a shell
    command); it and its scope set are stamped on the run."""
    requested = _validated(agent, input, limits, idempotency_key)
    request_hash = _request_hash(agent, input, session, requested)
    input = scrub_text(input)  # secrets never reach the run, its events or its checkpoints
    replayed = _replay(tenant, idempotency_key, request_hash)
    if replayed is not None:
        return replayed, False
    version = _latest_version(tenant, agent)
    agent_id = version.agent_id
    run_limits = resolve_limits(settings.AGENTRT_DEFAULT_LIMITS, version.definition.get("limits") or {}, requested)
    stamp = _principal_stamp(principal)  # its reads need no lock: before the transaction
    now = CLOCK.now()
    try:
        with transaction.atomic(durable=True):
            session_row = _session_for(tenant, agent_id, session)
            if session_row is None or not Run.objects.filter(session=session_row).exclude(status__in=TERMINAL).exists():
                _check_quota(tenant)  # (text for a busy session is routed below, not counted)
            new_session = session_row is None
            if session_row is None:
                session_row = Session(id=IDS.new_id(), tenant=tenant, agent_id=agent_id, created_at=now)
            run = Run(
                id=IDS.new_id(),
                tenant=tenant,
                session=session_row,
                agent_id=agent_id,
                agent_version=version.version,
                input=input,
                limits=run_limits.model_dump(mode="json"),
                deadline_at=now + timedelta(seconds=run_limits.deadline_seconds)
                if run_limits.deadline_seconds
                else None,
                usage={},
                idempotency_key=idempotency_key or None,
                request_hash=request_hash,
                **stamp,
                created_at=now,
                updated_at=now,
            )
            history = [] if new_session else session_history(run)  # a new session has none: no read
            with pipelined():  # the inserts answer nothing the submit reads: one round trip for the three
                if new_session:  # built above, not yet written
                    session_row.save(force_insert=True)
                run.save(force_insert=True)
                _seed_checkpoint(run, history, now)
            _record_created(run, agent, now)
            enqueue_drive(run.id)
    except IntegrityError as exc:
        return _lost_race(exc, tenant, session, idempotency_key, request_hash, input, by)
    return run, True


def _principal_stamp(user: Any) -> dict[str, Any]:
    """Who the run acts for and its scope set (its permissions now): what the
    worker reads at each execution instead of a credential."""
    if user is None or not getattr(user, "is_authenticated", False):
        return {"principal_user_id": None, "principal_scopes": []}
    return {"principal_user_id": user.pk, "principal_scopes": granted_permissions(user)}


def _latest_version(tenant: Tenant, agent: str) -> LatestVersion:
    """The agent's latest version, in one read (submit latency: every read before
    the transaction is a round trip between the caller and its first model call)."""
    version = latest_version(tenant.id, agent)
    if version is None:
        if Agent.objects.filter(tenant=tenant, name=agent).exists():
            raise AgentVersion.DoesNotExist(f"agent {agent!r} has no row for its latest version")
        raise AgentNotFound(f"no agent named {agent!r}", fields={"agent": ["unknown agent"]})
    return version


def _validated(agent: Any, text: Any, limits: Any, idempotency_key: Any) -> dict:
    """Check the request's shape (every refusal names its field); return the limits the caller asked for."""
    if not isinstance(agent, str) or not agent:
        raise InvalidInput("agent must be an agent name", fields={"agent": ["must be an agent name"]})
    check_text(text, "input")
    if limits is not None and not isinstance(limits, dict):
        raise InvalidInput("limits must be an object", fields={"limits": ["must be an object"]})
    try:
        requested = Limits.model_validate(limits or {}, strict=True).given()
    except ValidationError as exc:
        fields = pydantic_fields(exc, "limits.")
        raise InvalidInput(f"invalid limits: {next(iter(fields))}", fields=fields) from None
    if idempotency_key is not None:
        check_text(idempotency_key, "Idempotency-Key", max_length=200)
    return requested


def _replay(tenant: Tenant, idempotency_key: str | None, request_hash: str) -> Run | None:
    """The run an earlier request with this Idempotency-Key created, if the body is the same; a different body
    under the same key is refused."""
    if not idempotency_key:
        return None
    existing = Run.objects.filter(tenant=tenant, idempotency_key=idempotency_key).first()
    if existing is not None and existing.request_hash != request_hash:
        raise IdempotencyConflict("this Idempotency-Key was used with a different request")
    return existing


def _session_for(tenant: Tenant, agent_id: UUID, session: UUID | str | None) -> Session | None:
    """The tenant's session the run continues (it must belong to the same agent), or None for a new one."""
    if session is None:
        return None
    try:
        session_id = UUID(str(session))
    except ValueError:
        raise InvalidInput("session must be a session id", fields={"session": ["not a valid id"]}) from None
    # By its key alone, the tenant checked on the row (as runs.services.scoping.scoped_one does, and why).
    session_row = Session.objects.filter(id=session_id).first()
    if session_row is None or session_row.tenant_id != tenant.id:
        raise InvalidInput("unknown session", fields={"session": ["unknown session"]})
    if session_row.agent_id != agent_id:
        raise InvalidInput("the session belongs to another agent", fields={"session": ["belongs to another agent"]})
    return session_row


def _record_created(run: Run, agent: str, now) -> None:
    """`run.created`, in the submit's transaction (epoch 0: no lease yet)."""
    event = EventWrite(
        "run.created",
        {"agent": agent, "agent_version": run.agent_version, "input": run.input[:2000], **submit_context(run.id)},
        now,
    )
    with statement_cursor() as cursor:  # prepared once per connection
        append_events(
            cursor, tenant_id=run.tenant_id, session_id=run.session_id, run_id=run.id, epoch=0, events=[event]
        )


def _lost_race(
    exc: IntegrityError,
    tenant: Tenant,
    session: UUID | str | None,
    idempotency_key: str | None,
    request_hash: str,
    text: str,
    by: str,
) -> tuple[Run, bool]:
    """A concurrent request won a unique constraint: the session's one active run (text for a run that waits
    for the user becomes its input) or the Idempotency-Key (the same body replays the winner's run)."""
    message = str(exc)
    if "one_active_run_per_session" in message or "runs.session_id" in message:
        active = Run.objects.filter(session_id=session, status="WAITING_FOR_USER").first() if session else None
        if active is not None:
            routed = run_input(run=active, text=text, by=by)
            routed.routed = True
            return routed, False
        raise ActiveRunExists(
            "the session already has an active run", fields={"session": ["has an active run"]}
        ) from None
    if "run_idempotency_key_unique" in message or "idempotency_key" in message:
        existing = Run.objects.filter(tenant=tenant, idempotency_key=idempotency_key).first()
        if existing is not None and existing.request_hash == request_hash:
            return existing, False
        raise IdempotencyConflict("this Idempotency-Key was used with a different request") from None
    raise exc


def _check_quota(tenant: Tenant) -> None:
    """Refuse a run beyond the tenant's active-run quota. Call inside the submit's
    transaction: the tenant row lock serializes concurrent submits of one tenant,
    so two cannot both pass at the limit. FOR NO KEY UPDATE: it does not block
    the FOR KEY SHARE that inserts referencing the tenant take."""
    active, limit = active_runs_and_quota(tenant.id)
    if limit is None:
        limit = settings.AGENTRT_MAX_ACTIVE_RUNS or None  # the setting's 0 means no limit
    if limit is not None and active >= limit:
        raise QuotaExceeded(f"the tenant has {active} active runs and its quota is {limit}; wait for some to finish")


def _seed_checkpoint(run: Run, history: list[dict], now) -> None:
    """Version 1 of the run: the session's history and the new input."""
    state = CheckpointState(conversation=history + [{"role": "user", "content": run.input}])
    row = state.next_checkpoint("seed", now)
    Checkpoint.objects.create(
        id=IDS.new_id(),
        tenant_id=run.tenant_id,
        run=run,
        version=row.version,
        full=True,
        base_version=None,
        trigger="seed",
        state=row.state,
        code_version=settings.AGENTRT_CODE_VERSION,
        created_at=now,
    )


def run_get(*, tenant: Tenant | None, run_id: Any) -> Run:
    try:
        rid = UUID(str(run_id))
    except ValueError:
        raise RunNotFound("no such run") from None
    qs = Run.objects.select_related("agent")
    if tenant is not None:
        qs = qs.filter(tenant=tenant)
    run = qs.filter(id=rid).first()
    if run is None:
        raise RunNotFound("no such run")
    return run
