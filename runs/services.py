"""Services of the runs app: plain keyword-only functions, one transaction each."""
from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection, transaction
from pydantic import ValidationError

from checkpoints.models import Checkpoint
from checkpoints.repository import session_history
from ops.tracing import submit_context

from .agent_schema import AgentDefinition, Limits, forbidden_model_keys, resolve_limits
from .clock import CLOCK, IDS
from .domain.checkpoint import CheckpointState
from .domain.context import canonical_json
from .domain.scrub import scrub_text
from .domain.values import TERMINAL_STATUSES, RunStatus
from .domain.writes import EventWrite
from .errors import ActiveRunExists, AgentNotFound, IdempotencyConflict, InvalidInput, QuotaExceeded, RunNotFound, TenantNotFound
from .models import TERMINAL, Agent, AgentVersion, Membership, Run, Session, Tenant
from .store import append_events


def _pydantic_fields(exc: ValidationError, prefix: str = "") -> dict[str, list[str]]:
    fields: dict[str, list[str]] = {}
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"] if not (isinstance(p, str) and p in ("ScriptedModel", "OpenAIModel", "scripted", "openai")))
        fields.setdefault(prefix + (loc or "(root)"), []).append(err["msg"])
    return fields


def check_text(value: Any, field: str, *, max_length: int = 100_000, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"{field} must be a string", fields={field: ["must be a string"]})
    if not allow_empty and not value.strip():
        raise InvalidInput(f"{field} must not be empty", fields={field: ["must not be empty"]})
    if len(value) > max_length:
        raise InvalidInput(f"{field} is too long", fields={field: [f"at most {max_length} characters"]})
    if "\x00" in value:
        raise InvalidInput(f"{field} contains a NUL character", fields={field: ["NUL characters are not allowed"]})
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"{field} contains a lone surrogate", fields={field: ["invalid Unicode (lone surrogate)"]}) from None
    return value


# -- tenants --------------------------------------------------------------------

# What `create_tenant --operator` grants: admin access (is_staff) and these.
OPERATOR_PERMISSIONS = (
    ("approvals", "resolve_approval"), ("approvals", "view_approval"),
    ("runs", "cancel_run"), ("runs", "resume_run"),
    ("runs", "view_run"), ("runs", "view_agent"), ("runs", "view_agentversion"), ("runs", "view_event"),
    ("runs", "view_toolinvocation"), ("runs", "view_modelcall"), ("runs", "view_session"),
    ("checkpoints", "view_checkpoint"),
    ("webhooks", "manage_webhooks"), ("webhooks", "view_webhooksubscription"), ("webhooks", "view_delivery"),
)


def tenant_create(*, name: str, username: str, password: str | None = None, superuser: bool = False,
                  operator: bool = False) -> tuple[Tenant, Any]:
    """Create the tenant if needed, the user if missing, and make it a member.

    A member is not staff; `operator` makes USER staff with OPERATOR_PERMISSIONS."""
    from django.contrib.auth.models import Permission

    check_text(name, "name", max_length=100)
    User = get_user_model()
    with transaction.atomic(durable=True):
        tenant, _ = Tenant.objects.get_or_create(name=name)
        user = User.objects.filter(username=username).first()
        if user is None:
            user = User(username=username, is_staff=bool(operator or superuser), is_superuser=superuser)
            if password:
                user.set_password(password)
            else:
                user.set_unusable_password()
            user.save()
        elif password:
            user.set_password(password)
            user.save()
        membership = Membership.objects.filter(user=user).first()
        if membership is None:
            Membership.objects.create(tenant=tenant, user=user)
        elif membership.tenant_id != tenant.id:
            raise InvalidInput(f"user {username!r} already belongs to another tenant", fields={"user": ["belongs to another tenant"]})
        if operator:
            if not user.is_staff:
                User.objects.filter(pk=user.pk).update(is_staff=True)
            wanted = [Permission.objects.get(content_type__app_label=app, codename=code) for app, code in OPERATOR_PERMISSIONS]
            user.user_permissions.add(*wanted)
    return tenant, User.objects.get(pk=user.pk)


_UNCHANGED = object()


def tenant_configure(*, tenant: Tenant, policy_floor: Any = _UNCHANGED, max_active_runs: Any = _UNCHANGED,
                     name: Any = _UNCHANGED) -> Tenant:
    """Change a tenant's policy floor (applies from the next step of every run), quota or name.

    Callers authorize: the admin lets `runs.change_tenant` holders change
    their own tenant's floor and only superusers the quota and name."""
    changes: dict[str, Any] = {}
    if policy_floor is not _UNCHANGED:
        changes["policy_floor"] = policy_floor_check(policy_floor)
    if max_active_runs is not _UNCHANGED:
        if max_active_runs is not None and (isinstance(max_active_runs, bool) or not isinstance(max_active_runs, int) or max_active_runs < 0):
            raise InvalidInput("max_active_runs must be a non-negative integer or null", fields={"max_active_runs": ["invalid"]})
        changes["max_active_runs"] = max_active_runs
    if name is not _UNCHANGED:
        changes["name"] = check_text(name, "name", max_length=100)
    if changes:  # one UPDATE: atomic alone (the admin calls this inside its own transaction)
        Tenant.objects.filter(id=tenant.id).update(**changes)
    tenant.refresh_from_db()
    return tenant


def policy_floor_check(floor: Any) -> dict:
    """The floor in canonical form, or InvalidInput naming the field."""
    from .agent_schema import Policy

    if floor in (None, ""):
        return {}
    if not isinstance(floor, dict):
        raise InvalidInput("the policy floor must be a JSON object", fields={"policy_floor": ["must be an object"]})
    try:
        return Policy.model_validate(floor, strict=True).normal()
    except ValidationError as exc:
        fields = _pydantic_fields(exc, "policy_floor.")
        first = next(iter(fields.items()))
        raise InvalidInput(f"invalid policy floor: {first[0]}: {first[1][0]}", fields=fields) from None


def tenant_get(*, name: str) -> Tenant:
    tenant = Tenant.objects.filter(name=name).first()
    if tenant is None:
        raise TenantNotFound(f"no tenant named {name!r}")
    return tenant


def tenant_of(user) -> Tenant | None:
    """The tenant `user` acts in (see runs.scoping)."""
    from .scoping import tenant_for

    return tenant_for(user)


# -- agents ---------------------------------------------------------------------

def agent_load(*, tenant: Tenant, definition: Any, published_by=None) -> AgentVersion:
    """Create or update an agent; its version is the hash of its definition.

    Callers authorize: REST requires `runs.publish_agent`; `load_agent` is
    the operator's shell. `published_by` (None for the shell) and
    `published_at` are recorded on a new version."""
    if not isinstance(definition, dict):
        raise InvalidInput("the agent definition must be a JSON object", fields={"(root)": ["must be an object"]})
    forbidden = forbidden_model_keys(definition)  # a definition never chooses where a key goes
    try:
        parsed = AgentDefinition.model_validate(definition)
    except ValidationError as exc:
        fields = {**_pydantic_fields(exc), **forbidden}
        first = next(iter(forbidden.items())) if forbidden else next(iter(fields.items()))
        raise InvalidInput(f"invalid agent definition: {first[0]}: {first[1][0]}", fields=fields) from None
    if forbidden:
        first = next(iter(forbidden.items()))
        raise InvalidInput(f"invalid agent definition: {first[0]}: {first[1][0]}", fields=forbidden)
    normal = parsed.model_dump(mode="json", exclude_none=False)
    normal["policy"] = parsed.policy.normal()
    normal["limits"] = parsed.limits.given()
    version = hashlib.sha256(canonical_json(normal).encode()).hexdigest()
    policy_version = hashlib.sha256(canonical_json(normal["policy"]).encode()).hexdigest()[:16]
    now = CLOCK.now()
    with transaction.atomic(durable=True):
        agent = Agent.objects.select_for_update().filter(tenant=tenant, name=parsed.name).first()
        if agent is None:
            agent = Agent.objects.create(id=IDS.new_id(), tenant=tenant, name=parsed.name, latest_version=version, created_at=now, updated_at=now)
        else:
            Agent.objects.filter(id=agent.id).update(latest_version=version, updated_at=now)
        av, _ = AgentVersion.objects.get_or_create(
            agent=agent, version=version,
            defaults={"id": IDS.new_id(), "tenant": tenant, "definition": normal, "policy_version": policy_version, "created_at": now,
                      "published_by": published_by, "published_at": now},
        )
    return av


# -- runs -----------------------------------------------------------------------

def _request_hash(agent: str, text: str, session: Any, limits: Any) -> str:
    return hashlib.sha256(canonical_json({"agent": agent, "input": text, "session": str(session) if session else None, "limits": limits}).encode()).hexdigest()


def run_submit(
    *,
    tenant: Tenant,
    agent: str,
    input: str,
    session: UUID | str | None = None,
    limits: dict | None = None,
    idempotency_key: str | None = None,
    by: str = "",
) -> tuple[Run, bool]:
    """Create a run and ring `drive_run` in the same transaction.

    Return (run, created); a replay of the same Idempotency-Key and body
    returns the original run with created=False."""
    if not isinstance(agent, str) or not agent:
        raise InvalidInput("agent must be an agent name", fields={"agent": ["must be an agent name"]})
    check_text(input, "input")
    if limits is not None and not isinstance(limits, dict):
        raise InvalidInput("limits must be an object", fields={"limits": ["must be an object"]})
    try:
        requested = Limits.model_validate(limits or {}, strict=True).given()
    except ValidationError as exc:
        fields = _pydantic_fields(exc, "limits.")
        raise InvalidInput(f"invalid limits: {next(iter(fields))}", fields=fields) from None
    if idempotency_key is not None:
        check_text(idempotency_key, "Idempotency-Key", max_length=200)
    request_hash = _request_hash(agent, input, session, requested)
    input = scrub_text(input)  # secrets never reach the run, its events or its checkpoints
    if idempotency_key:
        existing = Run.objects.filter(tenant=tenant, idempotency_key=idempotency_key).first()
        if existing is not None:
            if existing.request_hash != request_hash:
                raise IdempotencyConflict("this Idempotency-Key was used with a different request")
            return existing, False
    agent_row = Agent.objects.filter(tenant=tenant, name=agent).first()
    if agent_row is None:
        raise AgentNotFound(f"no agent named {agent!r}", fields={"agent": ["unknown agent"]})
    version = AgentVersion.objects.get(agent=agent_row, version=agent_row.latest_version)
    run_limits = resolve_limits(settings.AGENTRT_DEFAULT_LIMITS, version.definition.get("limits") or {}, requested)
    now = CLOCK.now()
    try:
        with transaction.atomic(durable=True):
            if session is not None:
                try:
                    session_id = UUID(str(session))
                except ValueError:
                    raise InvalidInput("session must be a session id", fields={"session": ["not a valid id"]}) from None
                session_row = Session.objects.filter(id=session_id, tenant=tenant).first()
                if session_row is None:
                    raise InvalidInput("unknown session", fields={"session": ["unknown session"]})
                if session_row.agent_id != agent_row.id:
                    raise InvalidInput("the session belongs to another agent", fields={"session": ["belongs to another agent"]})
            else:
                session_row = None
            if session_row is None or not Run.objects.filter(session=session_row).exclude(status__in=TERMINAL).exists():
                _check_quota(tenant)  # (text for a busy session is routed below, not counted)
            if session_row is None:
                session_row = Session.objects.create(id=IDS.new_id(), tenant=tenant, agent=agent_row, created_at=now)
            run = Run.objects.create(
                id=IDS.new_id(),
                tenant=tenant,
                session=session_row,
                agent=agent_row,
                agent_version=version.version,
                input=input,
                limits=run_limits.model_dump(mode="json"),
                deadline_at=now + timedelta(seconds=run_limits.deadline_seconds) if run_limits.deadline_seconds else None,
                usage={},
                idempotency_key=idempotency_key or None,
                request_hash=request_hash,
                created_at=now,
                updated_at=now,
            )
            _seed_checkpoint(run, now)
            with connection.cursor() as cursor:
                append_events(
                    cursor, tenant_id=tenant.id, session_id=session_row.id, run_id=run.id, epoch=0,
                    events=[EventWrite("run.created", {"agent": agent, "agent_version": version.version, "input": input[:2000],
                                                       **submit_context(run.id)}, now)],
                )
            from .executor import enqueue_drive

            enqueue_drive(run.id)
    except IntegrityError as exc:
        text = str(exc)
        if "one_active_run_per_session" in text or "runs.session_id" in text:
            active = Run.objects.filter(session_id=session, status="WAITING_FOR_USER").first() if session else None
            if active is not None:
                # Text sent to a session whose run waits for the user is its input.
                from .inputs import run_input

                routed = run_input(run=active, text=input, by=by)
                routed.routed = True
                return routed, False
            raise ActiveRunExists("the session already has an active run", fields={"session": ["has an active run"]}) from None
        if "run_idempotency_key_unique" in text or "idempotency_key" in text:
            existing = Run.objects.filter(tenant=tenant, idempotency_key=idempotency_key).first()
            if existing is not None and existing.request_hash == request_hash:
                return existing, False
            raise IdempotencyConflict("this Idempotency-Key was used with a different request") from None
        raise
    return run, True


def _check_quota(tenant: Tenant) -> None:
    """Refuse a run beyond the tenant's active-run quota. Call inside the submit's
    transaction: the tenant row lock serializes concurrent submits of one tenant,
    so two cannot both pass at the limit. FOR NO KEY UPDATE: it does not block
    the FOR KEY SHARE that inserts referencing the tenant take."""
    limit = Tenant.objects.select_for_update(no_key=True).filter(id=tenant.id).values_list("max_active_runs", flat=True).first()
    if limit is None:
        limit = settings.AGENTRT_MAX_ACTIVE_RUNS or None  # the setting's 0 means no limit
    if limit is None:
        return
    active = Run.objects.filter(tenant_id=tenant.id).exclude(status__in=TERMINAL).count()
    if active >= limit:
        raise QuotaExceeded(f"the tenant has {active} active runs and its quota is {limit}; wait for some to finish")


def _seed_checkpoint(run: Run, now) -> None:
    """Version 1 of the run: the session's history and the new input."""
    state = CheckpointState(conversation=session_history(run) + [{"role": "user", "content": run.input}])
    row = state.next_checkpoint("seed", now)
    Checkpoint.objects.create(
        id=IDS.new_id(), tenant_id=run.tenant_id, run=run, version=row.version, full=True, base_version=None,
        trigger="seed", state=row.state, code_version=settings.AGENTRT_CODE_VERSION, created_at=now,
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


def run_is_terminal(run: Run) -> bool:
    return run.status in {s.value for s in TERMINAL_STATUSES}


__all__ = ["tenant_create", "tenant_get", "tenant_of", "agent_load", "run_submit", "run_get", "RunStatus"]
