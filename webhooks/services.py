"""The webhook service: the one path by which the admin and the REST API
create, change, delete and test subscriptions.

Every read and write is scoped by runs.services.scoping: another tenant's
subscription or delivery is 404 (a superuser sees every tenant's but acts
only in its own). Writes need `webhooks.manage_webhooks`.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet

from runs.clock import CLOCK, IDS
from runs.errors import InvalidInput, RunError
from runs.models import Tenant
from runs.services import scoping

from .models import EVENT_TYPES, TEST_EVENT, Delivery, WebhookSubscription
from .outbound import UrlRefused, check_url
from .outbox import ring
from .secrets import encrypt, new_secret
from .visibility import can_manage  # who manages (admin and REST ask here too)


class SubscriptionNotFound(RunError):
    code = "not_found"
    status = 404


class SubscriptionLimit(RunError):
    code = "webhook_limit"
    status = 409


class ManageForbidden(RunError):
    code = "permission_denied"
    status = 403


def subscriptions_visible_to(user) -> QuerySet:
    return scoping.scope(WebhookSubscription.objects.all(), user)


def deliveries_of(subscription: WebhookSubscription) -> QuerySet:
    """The deliveries of a subscription the caller already found in its scope
    (`subscription_for`): they are its tenant's. Not narrowed by tenant again,
    so the subscription's index serves them whatever the statistics say."""
    return Delivery.objects.filter(subscription=subscription)


def subscription_for(*, user, subscription_id: Any, acting: bool = False) -> WebhookSubscription:
    row = scoping.scoped_one(WebhookSubscription.objects.all(), user, scoping.as_uuid(subscription_id), acting=acting)
    if row is None:
        raise SubscriptionNotFound("no such webhook subscription")
    return row


def check_fields(
    *, url: Any = None, event_types: Any = None, active: Any = None, description: Any = None, partial: bool = False
) -> dict:
    """The fields in canonical form, or InvalidInput naming each bad one."""
    bad: dict[str, list[str]] = {}
    out: dict[str, Any] = {}
    if url is not None or not partial:
        try:
            out["url"] = check_url(url)
        except UrlRefused as exc:
            bad["url"] = [str(exc)]
    if event_types is not None or not partial:
        if not isinstance(event_types, list) or not event_types or not all(isinstance(t, str) for t in event_types):
            bad["event_types"] = [f"must be a non-empty list of: {', '.join(EVENT_TYPES)}"]
        elif unknown := [t for t in event_types if t not in EVENT_TYPES]:
            bad["event_types"] = [f"unknown event type {unknown[0]!r}; one of: {', '.join(EVENT_TYPES)}"]
        else:
            out["event_types"] = sorted(set(event_types), key=EVENT_TYPES.index)
    if active is not None:
        if not isinstance(active, bool):
            bad["active"] = ["must be true or false"]
        else:
            out["active"] = active
    if description is not None:
        if not isinstance(description, str) or len(description) > 200 or "\x00" in description:
            bad["description"] = ["must be text of at most 200 characters"]
        else:
            out["description"] = description
    if bad:
        name, reasons = next(iter(bad.items()))
        raise InvalidInput(f"{name}: {reasons[0]}", fields=bad)
    return out


def _acting_tenant(user):
    if not can_manage(user):
        raise ManageForbidden("you do not have permission to manage webhooks (webhooks.manage_webhooks)")
    tenant = scoping.tenant_for(user)
    if tenant is None:
        raise ManageForbidden("you are not a member of any tenant; subscriptions belong to your own tenant")
    return tenant


def subscription_create(
    *, user, url: Any, event_types: Any, active: Any = True, description: Any = ""
) -> tuple[WebhookSubscription, str]:
    """Create a subscription in the caller's tenant; return it and its secret (the only time the secret is shown)."""
    tenant = _acting_tenant(user)
    fields = check_fields(
        url=url, event_types=event_types, active=True if active is None else active, description=description or ""
    )
    limit = int(settings.AGENTRT_WEBHOOK_MAX_PER_TENANT)
    with transaction.atomic():
        # The tenant row's lock serializes concurrent creates: the limit holds. Each event of a run writes
        # one delivery per matching subscription in the run's own transaction, so their number is bounded.
        Tenant.objects.select_for_update(no_key=True).filter(id=tenant.id).values_list("id", flat=True).first()
        if WebhookSubscription.objects.filter(tenant=tenant).count() >= limit:
            raise SubscriptionLimit(
                f"the tenant already has {limit} webhook subscriptions (AGENTRT_WEBHOOK_MAX_PER_TENANT)"
            )
        return _create(tenant, user, fields)


def _create(tenant, user, fields) -> tuple[WebhookSubscription, str]:
    secret = new_secret()
    now = CLOCK.now()
    row = WebhookSubscription.objects.create(
        id=IDS.new_id(),
        tenant=tenant,
        secret_encrypted=encrypt(secret),
        created_by=user,
        created_at=now,
        updated_at=now,
        **fields,
    )
    return row, secret


def subscription_update(*, user, subscription_id: Any, **changes) -> WebhookSubscription:
    row = subscription_for(user=user, subscription_id=subscription_id, acting=True)  # 404 before 403
    _acting_tenant(user)
    fields = check_fields(partial=True, **changes)
    if fields:
        WebhookSubscription.objects.filter(id=row.id).update(updated_at=CLOCK.now(), **fields)
    row.refresh_from_db()
    return row


def subscription_delete(*, user, subscription_id: Any) -> None:
    """Delete it; its pending deliveries end `cancelled` (their history stays)."""
    row = subscription_for(user=user, subscription_id=subscription_id, acting=True)
    _acting_tenant(user)
    with transaction.atomic():
        Delivery.objects.filter(subscription=row, status="pending").update(
            status="cancelled", last_error="the subscription was deleted", updated_at=CLOCK.now()
        )
        row.delete()


def send_test(*, user, subscription_id: Any) -> Delivery:
    """Queue a `webhook.test` event to the subscription (sent like any other: signed, retried)."""
    row = subscription_for(user=user, subscription_id=subscription_id, acting=True)
    _acting_tenant(user)
    try:
        check_url(row.url)
    except UrlRefused as exc:
        raise InvalidInput(f"url: {exc}", fields={"url": [str(exc)]}) from None
    now = CLOCK.now()
    delivery_id = IDS.new_id()
    payload = {
        "id": str(delivery_id),
        "type": TEST_EVENT,
        "occurred_at": now.isoformat(),
        "tenant": row.tenant.name,
        "data": {"subscription": str(row.id), "sent_by": user.get_username()},
        "links": {},
    }
    with transaction.atomic():
        delivery = Delivery.objects.create(
            id=delivery_id,
            tenant_id=row.tenant_id,
            kind="webhook",
            subscription=row,
            event_type=TEST_EVENT,
            payload=payload,
            due_at=now,
            rung_at=now,
            created_at=now,
            updated_at=now,
        )
        ring(delivery.id)
    return delivery
