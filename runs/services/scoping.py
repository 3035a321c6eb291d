"""Tenant scoping: the one place that says which rows a user may see and act on.

A user belongs to at most one tenant (its Membership) and acts in it. A
superuser *sees* every tenant but *acts* only in its own:
cancel, resume, input, approve and reject on another tenant's object are
404, exactly as for anyone else. REST, the live pages, the admin, the
WebSocket consumers and the services all ask here; nothing else filters by
tenant on a user's behalf.

`*_visible_to(user)` narrow the lists; one object is read by its key and
checked with `scoped_one` (`acting=True` for writes: `run_actionable`,
`approval_for(acting=True)`). Anonymous or inactive users, and users without
a tenant (other than a superuser's reads), see nothing.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.contrib.auth import get_user_model
from django.db.models import QuerySet

from approvals.models import Approval
from runs.errors import RunNotFound
from runs.models import Agent, AgentVersion, Event, Membership, Run, Tenant
from runs.store.auth import member_tenant


def _authenticated(user) -> bool:
    return bool(user is not None and getattr(user, "is_authenticated", False) and getattr(user, "is_active", False))


def tenant_for(user) -> Tenant | None:
    """The tenant `user` belongs to and acts in, or None."""
    if not _authenticated(user):
        return None
    return member_tenant(user.pk)  # one prepared read (runs.store), not the ORM's: asked on every request


def sees_every_tenant(user) -> bool:
    return _authenticated(user) and bool(user.is_superuser)


def scope(queryset: QuerySet, user, *, acting: bool = False, field: str = "tenant_id") -> QuerySet:
    """`queryset` narrowed to what `user` may see (or, with `acting`, act on)."""
    if not _authenticated(user):
        return queryset.none()
    if not acting and sees_every_tenant(user):
        return queryset
    tenant = tenant_for(user)
    if tenant is None:
        return queryset.none()
    return queryset.filter(**{field: tenant.id})


def in_scope(user, tenant_id: Any, *, acting: bool = False) -> bool:
    """Whether `user` may see (with `acting`: act on) a row of tenant `tenant_id`:
    the same rule as `scope`, asked of a row already read."""
    if not _authenticated(user):
        return False
    if not acting and sees_every_tenant(user):
        return True
    tenant = tenant_for(user)
    return tenant is not None and tenant.id == tenant_id


def scoped_one(queryset: QuerySet, user, key: Any, *, acting: bool = False, field: str = "tenant_id") -> Any:
    """The row of `queryset` whose primary key is `key`, if `user` may see it
    (with `acting`: act on it); None otherwise — another tenant's row exactly
    as a missing one.

    Read by the key alone, the scope then checked on the row. Narrowed first
    (`WHERE tenant_id = T AND id = X`), the lookup leaves the planner two
    indexes that each claim one row when the statistics predate the tenant's
    rows (a tenant that grew since the last ANALYZE), and the tenant's index
    reads every row of the tenant to find one. `WHERE id = X` has one
    candidate, the primary key, whatever the statistics say."""
    if key is None or not _authenticated(user):
        return None
    row = queryset.filter(pk=key).first()
    if row is None or not in_scope(user, getattr(row, field), acting=acting):
        return None
    return row


def scoped_all(queryset: QuerySet, user, keys, *, field: str = "tenant_id") -> QuerySet | None:
    """`queryset` narrowed to the rows whose primary keys are `keys` if each
    exists and `user` may act on every one (its own tenant's only); None
    otherwise. Read by the keys alone, like `scoped_one`."""
    keys = set(keys)
    tenant = tenant_for(user)
    if tenant is None:
        return None
    rows = queryset.filter(pk__in=keys)
    found = list(rows.values_list(field, flat=True))
    if len(found) != len(keys) or any(tenant_id != tenant.id for tenant_id in found):
        return None
    return rows


def user_with_access(user_id: Any, tenant_id: Any):
    """The re-check of a long-lived connection (the run sockets): the user if it
    is still a member of `tenant_id`, or — with no tenant — still a superuser
    (one query either way); None when the access is gone. Whether the user is
    active and its credential still valid is the caller's to check."""
    if tenant_id is not None:  # the user and its membership in one query
        membership = Membership.objects.filter(user_id=user_id, tenant_id=tenant_id).select_related("user").first()
        return membership.user if membership else None

    return get_user_model().objects.filter(pk=user_id, is_superuser=True).first()


def tenant_events(tenant_id: Any) -> QuerySet:
    """Every event of one tenant: what the tenant's runs socket streams (the
    socket took `tenant_id` from `tenant_for` when it opened)."""

    return Event.objects.filter(tenant_id=tenant_id)


def runs_visible_to(user) -> QuerySet:
    return scope(Run.objects.select_related("agent"), user)


def agents_visible_to(user) -> QuerySet:
    return scope(Agent.objects.all(), user)


def tenant_named(queryset: QuerySet, name: str, *, field: str = "tenant_id") -> QuerySet:
    """`queryset` (already scoped to a user) narrowed to the tenant called
    `name`: a filter within what the user sees, so a member naming another
    tenant, or a name no tenant has, lists nothing (it tells nothing either)."""
    tenant_id = Tenant.objects.filter(name=name).values_list("id", flat=True).first()
    if tenant_id is None:
        return queryset.none()
    return queryset.filter(**{field: tenant_id})


def approvals_actionable_by(user) -> QuerySet:
    """The approvals `user` may decide: its own tenant's (a superuser's too)."""
    return scope(Approval.objects.select_related("run", "run__agent", "invocation", "decided_by"), user, acting=True)


def agent_versions_visible_to(user) -> QuerySet:
    return scope(AgentVersion.objects.select_related("agent"), user)


def approvals_visible_to(user) -> QuerySet:
    return scope(Approval.objects.select_related("run", "invocation", "decided_by"), user)


def as_uuid(value: Any) -> UUID | None:
    """`value` as a UUID, or None when it is not one (never raises)."""
    try:
        return UUID(str(value))
    except (ValueError, TypeError, AttributeError):
        return None


def run_visible(user, run_id: Any) -> Run:
    """The run if `user` may see it; RunNotFound (404) otherwise."""
    return _one(run_id, user, acting=False)


def run_actionable(user, run_id: Any) -> Run:
    """The run if `user` may act on it (its own tenant only); RunNotFound (404) otherwise."""
    return _one(run_id, user, acting=True)


def _one(run_id: Any, user, *, acting: bool) -> Run:
    run = scoped_one(Run.objects.select_related("agent"), user, as_uuid(run_id), acting=acting)
    if run is None:
        raise RunNotFound("no such run")
    return run
