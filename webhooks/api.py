"""REST for webhook subscriptions, under /api/webhooks/.

Reads: any member of the tenant (the secret is never in a read; a URL's path,
query and credentials and a receiver's answers only to operators, see
webhooks.visibility). Writes (create, change, delete, send a test event):
`webhooks.manage_webhooks`. Another tenant's subscription is 404, before any
permission check.
"""

from __future__ import annotations

import functools

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from runs.api.serializers import Empty, StrictBooleanField, StrictCharField, StrictSerializer
from runs.api.views import (
    ID_PARAM,
    LIST_ERRORS,
    NO_FIELDS,
    READ_ERRORS,
    WRITE_ERRORS,
    ApiListView,
    ApiView,
    errors,
    parse,
)

from . import services, visibility
from .models import EVENT_TYPES, Delivery

URL_HELP = (
    "http or https, on a host and port listed in AGENTRT_WEBHOOK_ALLOWED_HOSTS (host:port, or a bare host for ports "
    "80 and 443); no credentials, no fragment."
)


class SubscriptionCreate(StrictSerializer):
    """A new subscription. Its secret is generated and returned once, in this answer."""

    url = StrictCharField(max_length=2000, help_text=URL_HELP)
    event_types = serializers.ListField(
        child=serializers.ChoiceField(choices=list(EVENT_TYPES)), min_length=1, max_length=len(EVENT_TYPES)
    )
    active = StrictBooleanField(required=False, default=True)
    description = StrictCharField(max_length=200, required=False, allow_blank=True, default="")


class SubscriptionChange(StrictSerializer):
    """Fields to change (any subset). The secret cannot be changed or read."""

    url = StrictCharField(max_length=2000, required=False, help_text=URL_HELP)
    event_types = serializers.ListField(
        child=serializers.ChoiceField(choices=list(EVENT_TYPES)),
        min_length=1,
        max_length=len(EVENT_TYPES),
        required=False,
    )
    active = StrictBooleanField(required=False)
    description = StrictCharField(max_length=200, required=False, allow_blank=True)


def _reader(serializer):
    """The user a serializer answers (None: nobody known, so everything masked)."""
    request = serializer.context.get("request")
    return getattr(request, "user", None)


class SubscriptionOut(serializers.Serializer):
    id = serializers.UUIDField()
    url = serializers.CharField(
        help_text="As stored for operators (webhooks.manage_webhooks); for anyone else its origin only, "
        "`https://host/…`: a path, a query or credentials may carry the receiver's token."
    )
    event_types = serializers.ListField(child=serializers.ChoiceField(choices=list(EVENT_TYPES)))
    active = serializers.BooleanField()
    description = serializers.CharField(allow_blank=True)
    created_by = serializers.CharField(allow_null=True, help_text="Username of the creator.")
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    def to_representation(self, row):
        return {
            "id": str(row.id),
            "url": visibility.url_for(_reader(self), row.url),
            "event_types": list(row.event_types or []),
            "active": row.active,
            "description": row.description,
            "created_by": row.created_by.get_username() if row.created_by else None,
            "created_at": row.created_at.isoformat(),
            "updated_at": row.updated_at.isoformat(),
        }


class SubscriptionCreatedOut(SubscriptionOut):
    secret = serializers.CharField(help_text="The signing secret. Shown only in this answer: store it now.")

    def to_representation(self, row):
        return {**super().to_representation(row), "secret": row.plaintext_secret}


class DeliveryOut(serializers.Serializer):
    id = serializers.UUIDField(help_text="The delivery id, sent as X-Agentrt-Delivery on every attempt.")
    subscription = serializers.UUIDField(allow_null=True)
    run = serializers.UUIDField(allow_null=True)
    event_type = serializers.CharField()
    status = serializers.ChoiceField(choices=[s for s, _ in Delivery.STATUSES])
    attempts = serializers.IntegerField()
    last_error = serializers.CharField(
        allow_blank=True,
        help_text="The last attempt's error. A receiver's answer (`HTTP <code>: <its first 200 bytes>`) is shown to "
        "operators only; anyone else reads `HTTP <code>: [answer hidden: operators only]`.",
    )
    last_status_code = serializers.IntegerField(allow_null=True)
    next_attempt_at = serializers.DateTimeField(allow_null=True, help_text="When it is due again (pending only).")
    delivered_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()
    payload = serializers.DictField(help_text="The JSON body sent on every attempt.")

    def to_representation(self, d):
        return {
            "id": str(d.id),
            "subscription": str(d.subscription_id) if d.subscription_id else None,
            "run": str(d.run_id) if d.run_id else None,
            "event_type": d.event_type,
            "status": d.status,
            "attempts": d.attempts,
            "last_error": visibility.error_for(_reader(self), d.last_error),
            "last_status_code": d.last_status_code,
            "next_attempt_at": d.due_at.isoformat() if d.status == "pending" else None,
            "delivered_at": d.delivered_at.isoformat() if d.delivered_at else None,
            "created_at": d.created_at.isoformat(),
            "payload": d.payload,
        }


MANAGE_DOC = "Needs `webhooks.manage_webhooks` (403 `permission_denied` otherwise). "


class WebhookListCreate(ApiListView):
    """Webhook subscriptions of your tenant."""

    throttle_scope = "webhooks"

    @extend_schema(
        operation_id="webhooks_list",
        tags=["webhooks"],
        summary="Webhook subscriptions of your tenant, newest first",
        responses={200: SubscriptionOut(many=True), **errors(*LIST_ERRORS)},
    )
    def get(self, request):
        qs = services.subscriptions_visible_to(request.user).select_related("created_by").order_by("-created_at", "id")
        return self.page(qs, functools.partial(SubscriptionOut, context={"request": request}))

    @extend_schema(
        operation_id="webhooks_create",
        tags=["webhooks"],
        summary="Subscribe a URL to events",
        description=MANAGE_DOC + "The answer carries `secret`, shown this once. 400 naming `url` for a host not in "
        "AGENTRT_WEBHOOK_ALLOWED_HOSTS. 409 `webhook_limit` beyond AGENTRT_WEBHOOK_MAX_PER_TENANT subscriptions.",
        request=SubscriptionCreate,
        responses={201: SubscriptionCreatedOut, **errors(*WRITE_ERRORS, 409)},
    )
    def post(self, request):
        data = parse(SubscriptionCreate, request.data)
        row, secret = services.subscription_create(user=request.user, **data)
        row.plaintext_secret = secret
        return Response(SubscriptionCreatedOut(row, context={"request": request}).data, status=status.HTTP_201_CREATED)


class WebhookDetail(ApiView):
    """One webhook subscription."""

    throttle_scope = "webhooks"

    @extend_schema(
        operation_id="webhooks_retrieve",
        tags=["webhooks"],
        parameters=[ID_PARAM],
        responses={200: SubscriptionOut, **errors(*READ_ERRORS, 404)},
    )
    def get(self, request, id):
        row = services.subscription_for(user=request.user, subscription_id=id)
        return Response(SubscriptionOut(row, context={"request": request}).data)

    @extend_schema(
        operation_id="webhooks_partial_update",
        tags=["webhooks"],
        summary="Change url, event types, active, description",
        description=MANAGE_DOC,
        parameters=[ID_PARAM],
        request=SubscriptionChange,
        responses={200: SubscriptionOut, **errors(*WRITE_ERRORS, 404)},
    )
    def patch(self, request, id):
        services.subscription_for(user=request.user, subscription_id=id, acting=True)  # 404 before 400/403
        data = parse(SubscriptionChange, request.data)
        row = services.subscription_update(user=request.user, subscription_id=id, **data)
        return Response(SubscriptionOut(row, context={"request": request}).data)

    @extend_schema(
        operation_id="webhooks_destroy",
        tags=["webhooks"],
        summary="Delete (its pending deliveries are cancelled)",
        description=MANAGE_DOC,
        parameters=[ID_PARAM],
        responses={204: OpenApiResponse(description="Deleted."), **errors(400, 401, 403, 404, 429)},
    )
    def delete(self, request, id):
        services.subscription_delete(user=request.user, subscription_id=id)
        return Response(status=status.HTTP_204_NO_CONTENT)


class WebhookTest(ApiView):
    """Send a test event."""

    throttle_scope = "webhooks"

    @extend_schema(
        operation_id="webhooks_test",
        tags=["webhooks"],
        summary="Send a `webhook.test` event",
        description=MANAGE_DOC + "Queued like any event (signed, retried); the answer is its delivery (202).",
        parameters=[ID_PARAM],
        request=NO_FIELDS,
        responses={202: DeliveryOut, **errors(*WRITE_ERRORS, 404)},
    )
    def post(self, request, id):
        services.subscription_for(user=request.user, subscription_id=id, acting=True)
        parse(Empty, request.data)
        delivery = services.send_test(user=request.user, subscription_id=id)
        return Response(DeliveryOut(delivery, context={"request": request}).data, status=status.HTTP_202_ACCEPTED)


class WebhookDeliveries(ApiListView):
    """Deliveries to one subscription, newest first."""

    @extend_schema(
        operation_id="webhooks_deliveries",
        tags=["webhooks"],
        summary="Deliveries to this subscription, newest first",
        parameters=[ID_PARAM],
        responses={200: DeliveryOut(many=True), **errors(*LIST_ERRORS)},
    )
    def get(self, request, id):
        row = services.subscription_for(user=request.user, subscription_id=id)
        return self.page(
            services.deliveries_of(row).order_by("-created_at", "id"),
            functools.partial(DeliveryOut, context={"request": request}),
        )
