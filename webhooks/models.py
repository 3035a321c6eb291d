"""Webhook subscriptions and the deliveries of hooks and webhooks.

A `Delivery` is written in the same transaction as the event it announces
(a run's terminal transition, an approval requested or resolved, a run
waiting for its user): a crash cannot lose it. Its id is the delivery id
(`X-Agentrt-Delivery`), stable across retries. `due_at` is when it may be
attempted next; a worker that takes it (a guarded UPDATE) pushes `due_at`
forward by AGENTRT_DELIVERY_CLAIM_SECONDS, so a worker killed mid-delivery
leaves it due again after that, and the maintenance sweep rings it again.
"""

from django.conf import settings
from django.db import models
from django.db.models import Q

from runs.clock import new_uuid, utcnow

from .visibility import masked_url

# What a subscription may ask for. `webhook.test` is sent
# only by "send test event", whatever the subscription's event types.
EVENT_TYPES = (
    "run.completed",
    "run.failed",
    "run.cancelled",
    "approval.requested",
    "approval.resolved",
    "run.waiting_for_user",
)
TEST_EVENT = "webhook.test"
# The terminal events: each one enqueues every registered post-run hook.
TERMINAL_EVENTS = ("run.completed", "run.failed", "run.cancelled")


class WebhookSubscription(models.Model):
    id = models.UUIDField(primary_key=True, default=new_uuid, editable=False)
    # No index of its own: webhook_subs_tenant_idx leads with the tenant.
    tenant = models.ForeignKey(
        "runs.Tenant", on_delete=models.CASCADE, related_name="webhook_subscriptions", db_index=False
    )
    url = models.URLField(max_length=2000)
    event_types = models.JSONField(default=list)
    active = models.BooleanField(default=True)
    description = models.CharField(max_length=200, blank=True, default="")
    # The signing secret, encrypted (webhooks.secrets): shown once at creation, never read back.
    secret_encrypted = models.TextField(editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, editable=False
    )
    created_at = models.DateTimeField(default=utcnow, editable=False)
    updated_at = models.DateTimeField(default=utcnow, editable=False)

    class Meta:
        db_table = "webhook_subscriptions"
        verbose_name = "webhook subscription"
        permissions = [("manage_webhooks", "Can create, change, delete and test webhook subscriptions")]
        indexes = [models.Index(fields=["tenant", "active"], name="webhook_subs_tenant_idx")]

    def __str__(self):
        # Its name wherever the admin shows one (breadcrumbs, a delivery's subscription, history, deletion) is
        # the URL's origin: the path, query and credentials may hold the receiver's token (webhooks.visibility).
        return masked_url(self.url)


class Delivery(models.Model):
    KINDS = [("hook", "hook"), ("webhook", "webhook")]
    STATUSES = [(s, s) for s in ("pending", "succeeded", "failed", "cancelled")]

    id = models.UUIDField(primary_key=True, default=new_uuid, editable=False)
    # The three keys have no index of their own: deliveries_tenant_idx, deliveries_run_idx and
    # deliveries_sub_idx lead with them (deliveries_run_idx was an exact copy of the run key's).
    tenant = models.ForeignKey("runs.Tenant", on_delete=models.CASCADE, related_name="+", db_index=False)
    run = models.ForeignKey(
        "runs.Run", on_delete=models.CASCADE, null=True, blank=True, related_name="+", db_index=False
    )
    kind = models.CharField(max_length=8, choices=KINDS)
    hook = models.CharField(max_length=200, blank=True, default="")
    subscription = models.ForeignKey(
        WebhookSubscription, on_delete=models.SET_NULL, null=True, blank=True, related_name="deliveries", db_index=False
    )
    event_type = models.CharField(max_length=64)
    event_sequence = models.BigIntegerField(null=True, blank=True)
    # A webhook's JSON body, fixed when the event committed (identical on every attempt).
    payload = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=10, choices=STATUSES, default="pending")
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    due_at = models.DateTimeField(default=utcnow)
    rung_at = models.DateTimeField(null=True, blank=True)
    claimed_by = models.CharField(max_length=200, blank=True, default="")
    claimed_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=utcnow)
    updated_at = models.DateTimeField(default=utcnow)

    class Meta:
        db_table = "deliveries"
        verbose_name_plural = "deliveries"
        indexes = [
            models.Index(fields=["due_at"], condition=Q(status="pending"), name="deliveries_due_idx"),
            models.Index(fields=["tenant", "-created_at"], name="deliveries_tenant_idx"),
            models.Index(fields=["subscription", "-created_at"], name="deliveries_sub_idx"),
            models.Index(fields=["run"], name="deliveries_run_idx"),
        ]
        constraints = [
            # One delivery per hook per run: a run ends once.
            models.UniqueConstraint(
                fields=["run", "hook"], condition=Q(kind="hook"), name="delivery_one_per_hook_and_run"
            ),
        ]

    def __str__(self):
        return f"{self.event_type} → {self.hook or self.subscription_id} ({self.status})"
