"""Tenant services: create (with members and operators), configure (policy floor, quota, name, allow-lists),
look up."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import transaction
from pydantic import ValidationError

from runs.errors import InvalidInput, TenantNotFound
from runs.models import Membership, Tenant
from runs.services.agent_schema import Policy
from runs.services.allowlists import names_check
from runs.services.scoping import tenant_for
from runs.services.validation import check_text, pydantic_fields

# What `create_tenant --operator` grants: admin access (is_staff) and these.
OPERATOR_PERMISSIONS = (
    ("approvals", "resolve_approval"),
    ("approvals", "view_approval"),
    ("runs", "cancel_run"),
    ("runs", "resume_run"),
    ("runs", "view_run"),
    ("runs", "view_agent"),
    ("runs", "view_agentversion"),
    ("runs", "view_event"),
    ("runs", "view_toolinvocation"),
    ("runs", "view_modelcall"),
    ("runs", "view_session"),
    ("checkpoints", "view_checkpoint"),
    ("webhooks", "manage_webhooks"),
    ("webhooks", "view_webhooksubscription"),
    ("webhooks", "view_delivery"),
)


_UNCHANGED: Any = object()


def tenant_create(
    *,
    name: str,
    username: str | None = None,
    password: str | None = None,
    superuser: bool = False,
    operator: bool = False,
    allowed_tools: Any = _UNCHANGED,
    allowed_endpoints: Any = _UNCHANGED,
) -> tuple[Tenant, Any]:
    """Create the tenant if needed, the user if missing, and make it a member.

    A member is not staff; `operator` makes USER staff with OPERATOR_PERMISSIONS.
    Without `username` only the tenant is created (or found). `allowed_tools` /
    `allowed_endpoints` (lists of names, None for all) set the tenant's
    allow-lists, on a new or an existing tenant, in the same transaction; left
    out, they stay as they are (a new tenant's: null, everything)."""
    check_text(name, "name", max_length=100)
    lists = {}
    if allowed_tools is not _UNCHANGED:
        lists["allowed_tools"] = names_check(allowed_tools, "tools")
    if allowed_endpoints is not _UNCHANGED:
        lists["allowed_endpoints"] = names_check(allowed_endpoints, "endpoints")
    User = get_user_model()
    with transaction.atomic(durable=True):
        tenant, _ = Tenant.objects.get_or_create(name=name)
        if lists:
            Tenant.objects.filter(id=tenant.id).update(**lists)
            tenant.refresh_from_db()
        if username is None:
            return tenant, None
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
            raise InvalidInput(
                f"user {username!r} already belongs to another tenant", fields={"user": ["belongs to another tenant"]}
            )
        if operator:
            if not user.is_staff:
                User.objects.filter(pk=user.pk).update(is_staff=True)
            wanted = [
                Permission.objects.get(content_type__app_label=app, codename=code) for app, code in OPERATOR_PERMISSIONS
            ]
            user.user_permissions.add(*wanted)
    return tenant, User.objects.get(pk=user.pk)


def tenant_configure(
    *,
    tenant: Tenant,
    policy_floor: Any = _UNCHANGED,
    max_active_runs: Any = _UNCHANGED,
    name: Any = _UNCHANGED,
    allowed_tools: Any = _UNCHANGED,
    allowed_endpoints: Any = _UNCHANGED,
) -> Tenant:
    """Change a tenant's policy floor (applies from the next step of every run), quota, name or allow-lists
    (tools and model endpoints its agents may use: checked at the next publish and the next execution of
    every run; None: all).

    Callers authorize: the admin lets `runs.change_tenant` holders change
    their own tenant's floor and only superusers the quota, name and allow-lists."""
    changes: dict[str, Any] = {}
    if allowed_tools is not _UNCHANGED:
        changes["allowed_tools"] = names_check(allowed_tools, "tools")
    if allowed_endpoints is not _UNCHANGED:
        changes["allowed_endpoints"] = names_check(allowed_endpoints, "endpoints")
    if policy_floor is not _UNCHANGED:
        changes["policy_floor"] = policy_floor_check(policy_floor)
    if max_active_runs is not _UNCHANGED:
        if max_active_runs is not None and (
            isinstance(max_active_runs, bool) or not isinstance(max_active_runs, int) or max_active_runs < 0
        ):
            raise InvalidInput(
                "max_active_runs must be a non-negative integer or null", fields={"max_active_runs": ["invalid"]}
            )
        changes["max_active_runs"] = max_active_runs
    if name is not _UNCHANGED:
        changes["name"] = check_text(name, "name", max_length=100)
    if changes:  # one UPDATE: atomic alone (the admin calls this inside its own transaction)
        Tenant.objects.filter(id=tenant.id).update(**changes)
    tenant.refresh_from_db()
    return tenant


def policy_floor_check(floor: Any) -> dict:
    """The floor in canonical form, or InvalidInput naming the field."""
    if floor in (None, ""):
        return {}
    if not isinstance(floor, dict):
        raise InvalidInput("the policy floor must be a JSON object", fields={"policy_floor": ["must be an object"]})
    try:
        return Policy.model_validate(floor, strict=True).normal()
    except ValidationError as exc:
        fields = pydantic_fields(exc, "policy_floor.")
        first = next(iter(fields.items()))
        raise InvalidInput(f"invalid policy floor: {first[0]}: {first[1][0]}", fields=fields) from None


def tenant_get(*, name: str) -> Tenant:
    tenant = Tenant.objects.filter(name=name).first()
    if tenant is None:
        raise TenantNotFound(f"no tenant named {name!r}")
    return tenant


def tenant_of(user) -> Tenant | None:
    """The tenant `user` acts in (see runs.services.scoping)."""
    return tenant_for(user)
