"""Hash-bound approvals: one table for policy pauses,
interrupted side effects and reconciler pauses."""

from django.conf import settings
from django.db import models

from runs.clock import new_uuid, utcnow
from runs.domain.pipeline import RERUN_KINDS as _DOMAIN_RERUN_KINDS
from runs.domain.values import ApprovalStatus, choices
from runs.models import Unindexed

# Approval kinds. A "re-run grant" is an approval whose
# approve runs the same invocation again with the same idempotency key; a
# "confirmable" one may instead be settled by an operator who knows whether
# the call took effect (POST /api/approvals/{id}/confirm/).
POLICY = "policy"
INTERRUPTED_SIDE_EFFECT = "interrupted_side_effect"
UNCERTAIN_SIDE_EFFECT = "uncertain_side_effect"
RECONCILE = "reconcile"
RERUN_KINDS = _DOMAIN_RERUN_KINDS  # the one set, defined Django-free where the pipeline re-checks grants
CONFIRMABLE_KINDS = (INTERRUPTED_SIDE_EFFECT, UNCERTAIN_SIDE_EFFECT)
# An unknown outcome's question: the approval of a side-effect call that may
# have taken effect — interrupted, uncertain, or paused by the reconciler (the re-run grants). No timer closes
# it (no TTL, not the run's deadline, not the expiry sweep) and no cancel does, the run's own or a parent's:
# only a person's decision (approvals/unknown.py says how the run then ends).
UNKNOWN_OUTCOME_KINDS = RERUN_KINDS


class Approval(models.Model):
    KINDS = [(k, k) for k in (POLICY, INTERRUPTED_SIDE_EFFECT, RECONCILE, UNCERTAIN_SIDE_EFFECT)]
    STATUSES = choices(ApprovalStatus)
    SURFACES = [(s, s) for s in ("admin", "api", "live", "cli")]

    id = models.UUIDField(primary_key=True, default=new_uuid, editable=False)
    # No index of its own: approvals_pending_idx leads with the tenant.
    tenant = models.ForeignKey("runs.Tenant", on_delete=models.CASCADE, db_index=False)
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="approvals")
    invocation = models.ForeignKey("runs.ToolInvocation", on_delete=models.CASCADE, null=True, related_name="approvals")
    kind = models.CharField(max_length=32, choices=KINDS)
    request_hash = models.CharField(max_length=64)
    capability = models.JSONField(default=dict)
    presentation = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=STATUSES, default=ApprovalStatus.PENDING.value)
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


# `status__unindexed="pending"`: a statement that names its approval (or its
# run's approvals) keeps to that key; with `status = 'pending'` the planner may
# walk a partial index of the pending approvals and read all of them, when
# the statistics were taken before they were pending (runs.models.Unindexed).
Approval._meta.get_field("status").register_lookup(Unindexed)


def open_questions(run_id=None):
    """The pending approvals of unknown outcomes (UNKNOWN_OUTCOME_KINDS), of
    run `run_id` when given (then by the run's key: `status__unindexed`)."""
    if run_id is None:
        return Approval.objects.filter(status="pending", kind__in=UNKNOWN_OUTCOME_KINDS)
    return Approval.objects.filter(run_id=run_id, status__unindexed="pending", kind__in=UNKNOWN_OUTCOME_KINDS)
