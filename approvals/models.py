"""Hash-bound approvals (DESIGN §3, §8): one table for policy pauses,
interrupted side effects and reconciler pauses."""
from django.conf import settings
from django.db import models

from runs.clock import new_uuid, utcnow


class Approval(models.Model):
    KINDS = [(k, k) for k in ("policy", "interrupted_side_effect", "reconcile")]
    STATUSES = [(s, s) for s in ("pending", "approved", "rejected", "expired", "invalidated", "cancelled")]
    SURFACES = [(s, s) for s in ("admin", "api", "live")]

    id = models.UUIDField(primary_key=True, default=new_uuid, editable=False)
    tenant = models.ForeignKey("runs.Tenant", on_delete=models.CASCADE)
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="approvals")
    invocation = models.ForeignKey("runs.ToolInvocation", on_delete=models.CASCADE, null=True, related_name="approvals")
    kind = models.CharField(max_length=32, choices=KINDS)
    request_hash = models.CharField(max_length=64)
    capability = models.JSONField(default=dict)
    presentation = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=STATUSES, default="pending")
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_via = models.CharField(max_length=8, choices=SURFACES, null=True, blank=True)
    reason = models.TextField(default="", blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=utcnow)

    class Meta:
        db_table = "approvals"
        permissions = [("resolve_approval", "Can approve or reject a paused tool call")]
        indexes = [models.Index(fields=["tenant", "status", "-created_at"], name="approvals_pending_idx")]
