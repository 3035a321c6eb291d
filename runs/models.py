"""Tables of the runs app. Status and lease columns are written
only by their declared writers (tests/gates checks it)."""

from django.conf import settings
from django.db import models
from django.db.models import Q

from runs.clock import new_uuid, utcnow
from runs.domain.events import STATUS_EVENTS
from runs.domain.values import (
    LIVE_STATUSES,
    TERMINAL_STATUSES,
    InvocationOutcome,
    InvocationStatus,
    ModelCallStatus,
    RunStatus,
    choices,
)

TERMINAL = [s.value for s in TERMINAL_STATUSES]
STATUS_TYPES = [t.value for t in STATUS_EVENTS]
LIVE = [s.value for s in LIVE_STATUSES]


class Tenant(models.Model):
    id = models.UUIDField(primary_key=True, default=new_uuid, editable=False)
    name = models.CharField(max_length=100, unique=True)
    # The tenant's policy floor (agent policy shape): each call's decision is the
    # stricter of this and the agent's policy; read live when a call is evaluated.
    policy_floor = models.JSONField(default=dict, blank=True)
    # Active (non-terminal) runs allowed at once; null: AGENTRT_MAX_ACTIVE_RUNS.
    max_active_runs = models.PositiveIntegerField(null=True, blank=True)
    # The tools and the model endpoints this tenant's agents may use, by name;
    # null: every one (a single-team deployment). Checked when an agent is published and
    # again when a run executes (runs.services.allowlists).
    allowed_tools = models.JSONField(null=True, blank=True, default=None)
    allowed_endpoints = models.JSONField(null=True, blank=True, default=None)
    created_at = models.DateTimeField(default=utcnow, editable=False)

    class Meta:
        db_table = "tenants"

    def __str__(self):
        return self.name


class Membership(models.Model):
    """A user belongs to exactly one tenant and acts in it."""

    id = models.UUIDField(primary_key=True, default=new_uuid, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="membership")
    created_at = models.DateTimeField(default=utcnow, editable=False)

    class Meta:
        db_table = "memberships"


class Agent(models.Model):
    id = models.UUIDField(primary_key=True, default=new_uuid, editable=False)
    # No index of its own: agent_name_unique_per_tenant leads with the tenant (one index to pick, and to write).
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="agents", db_index=False)
    name = models.CharField(max_length=100)
    latest_version = models.CharField(max_length=64)
    created_at = models.DateTimeField(default=utcnow, editable=False)
    updated_at = models.DateTimeField(default=utcnow)

    class Meta:
        db_table = "agents"
        permissions = [("publish_agent", "Can publish an agent or a new agent version")]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="agent_name_unique_per_tenant")]

    def __str__(self):
        return self.name


class AgentVersion(models.Model):
    """Content-addressed: `version` is the SHA-256 of the canonical definition."""

    id = models.UUIDField(primary_key=True, default=new_uuid, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE)
    # No index of its own: agent_version_unique leads with the agent.
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="versions", db_index=False)
    version = models.CharField(max_length=64)
    definition = models.JSONField()
    policy_version = models.CharField(max_length=64, default="")
    published_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )  # null: loaded by an operator's shell command
    published_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=utcnow, editable=False)

    class Meta:
        db_table = "agent_versions"
        constraints = [models.UniqueConstraint(fields=["agent", "version"], name="agent_version_unique")]


class Session(models.Model):
    id = models.UUIDField(primary_key=True, default=new_uuid, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE)
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT)
    event_seq = models.BigIntegerField(default=0)  # incremented by UPDATE … RETURNING per append
    created_at = models.DateTimeField(default=utcnow, editable=False)

    class Meta:
        db_table = "sessions"


class Run(models.Model):
    STATUS_CHOICES = choices(RunStatus)

    id = models.UUIDField(primary_key=True, default=new_uuid, editable=False)
    # No index of its own: runs_tenant_created_idx (tenant, -created_at) starts with it and serves every lookup.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, db_index=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="runs")
    # No index of its own: runs_agent_created_idx (agent, -created_at) starts with it (the runs list's agent filter).
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, db_index=False)
    agent_version = models.CharField(max_length=64)
    status = models.CharField(max_length=24, choices=STATUS_CHOICES, default=RunStatus.QUEUED.value)
    input = models.TextField()
    limits = models.JSONField(default=dict)
    deadline_at = models.DateTimeField(null=True, blank=True)
    usage = models.JSONField(default=dict)
    step_count = models.IntegerField(default=0)
    failure = models.JSONField(null=True, blank=True)
    final_message = models.TextField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    lease_owner = models.CharField(max_length=200, null=True, blank=True)
    lease_epoch = models.BigIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    attempts = models.IntegerField(default=0)
    lease_expirations = models.IntegerField(default=0)
    priority = models.IntegerField(default=0)
    scheduled_for = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    # A child run: the run whose `delegate_run` call started it, and
    # that call's invocation, whose result the child's terminal transition writes.
    # Indexed only where set (runs_parent_idx): most runs have no parent.
    parent = models.ForeignKey(
        "self",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="children",
        editable=False,
        db_index=False,
    )
    parent_invocation = models.UUIDField(null=True, blank=True, editable=False)
    # Lineage: a fork continues another run's conversation after its step `forked_from_step` (what came
    # before is never run again), its side effects waiting for a person unless `fork_effects` is "policy";
    # a replay calls the model again and answers each call the original made at the same position with the
    # original's recorded result, executing nothing. Indexed only where set: most runs are neither.
    forked_from = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="forks", editable=False, db_index=False
    )
    forked_from_step = models.IntegerField(null=True, blank=True, editable=False)
    fork_effects = models.CharField(max_length=8, null=True, blank=True, editable=False)  # "approve" | "policy"
    replay_of = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="replays", editable=False, db_index=False
    )
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    request_hash = models.CharField(max_length=64, null=True, blank=True)
    # The principal the run acts for, stamped at submission: the submitting user (no FK — a user
    # deleted meanwhile must read as revoked, not as "no user") and its scope set then (its permissions).
    # Null: submitted by the system (a shell command).
    principal_user_id = models.BigIntegerField(null=True, blank=True)
    principal_scopes = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(default=utcnow, editable=False)
    updated_at = models.DateTimeField(default=utcnow)
    # When retention (AGENTRT_RETENTION_DAYS, `manage.py purge_runs`) removed the run's detail: its events,
    # tool invocations, approvals, model calls and checkpoints. The row keeps its input, final message,
    # result, failure and usage; a run without its detail is never retried, forked or replayed.
    detail_removed_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        db_table = "runs"
        permissions = [("cancel_run", "Can cancel a run"), ("resume_run", "Can resume a run whose lease expired")]
        constraints = [
            models.UniqueConstraint(
                fields=["session"], condition=~Q(status__in=TERMINAL), name="one_active_run_per_session"
            ),
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="run_idempotency_key_unique",
            ),
        ]
        indexes = [
            models.Index(fields=["deadline_at"], condition=Q(status__in=LIVE), name="runs_live_deadline_idx"),
            # Not on lease_expires_at: a heartbeat, which sets only that, stays a HOT update (no index entry).
            models.Index(fields=["status", "priority", "created_at"], name="runs_status_queue_idx"),
            models.Index(fields=["tenant", "-created_at"], name="runs_tenant_created_idx"),
            models.Index(fields=["parent"], condition=Q(parent__isnull=False), name="runs_parent_idx"),
            models.Index(fields=["forked_from"], condition=Q(forked_from__isnull=False), name="runs_forked_from_idx"),
            models.Index(fields=["replay_of"], condition=Q(replay_of__isnull=False), name="runs_replay_of_idx"),
            # The runs list's filters (runs.services.run_list): an agent's runs newest first; a tenant's failed
            # or cancelled ones, which only a run's end writes into (a claim or a wait writes nothing here).
            models.Index(fields=["agent", "-created_at"], name="runs_agent_created_idx"),
            models.Index(
                fields=["tenant", "status", "-created_at"],
                condition=Q(status__in=["FAILED", "CANCELLED"]),
                name="runs_tenant_ended_badly_idx",
            ),
            # Retention's candidates: a tenant's ended runs that still hold their detail, oldest first. Only a
            # run's end writes an entry and its detail's removal takes it out; a step's update stays HOT.
            models.Index(
                fields=["tenant", "created_at"],
                condition=Q(status__in=TERMINAL, detail_removed_at__isnull=True),
                name="runs_detail_kept_idx",
            ),
        ]

    def __str__(self):
        return f"{self.id} ({self.status})"


class Unindexed(models.Transform):
    """`status__unindexed="QUEUED"` (or `__unindexed__in=[...]`): the status
    compared in a form no index serves, `(status || '')`, for a statement that
    names its row by key (a run by id; approvals by id or by run, on
    Approval.status too). Only the key's index is then left to the planner;
    with a plain `status = ...` it may walk an index that holds the status
    (runs_status_queue_idx, runs_active_tenant_idx, the pending approvals'
    partial indexes) and read every row with that status, when the
    statistics were taken before those rows had it (runs.store.fence says the
    same of the hand-written statements)."""

    lookup_name = "unindexed"

    def as_sql(self, compiler, connection):
        lhs, params = compiler.compile(self.lhs)
        return f"({lhs} || '')", params


Run._meta.get_field("status").register_lookup(Unindexed)


class ModelCall(models.Model):
    """One row per model attempt: every step's persisted identity.

    Hot-path tables (model_calls, tool_invocations, events, checkpoints)
    carry no single-column FK indexes — the composite unique index that
    starts with `run` serves every lookup — and no database FK constraints:
    their rows are written only by the fenced statement, which writes
    nothing unless the run row (and so its tenant and session) exists, and
    Django still cascades deletes. Each index and each deferred FK check
    costs work on every step."""

    id = models.UUIDField(primary_key=True, default=new_uuid, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, db_index=False, db_constraint=False)
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="model_calls", db_index=False, db_constraint=False
    )
    step_number = models.IntegerField()
    attempt_number = models.IntegerField()
    status = models.CharField(max_length=16, default=ModelCallStatus.STARTED.value)  # a ModelCallStatus
    usage = models.JSONField(default=dict)
    stop_reason = models.CharField(max_length=24, null=True, blank=True)
    stream_had_output = models.BooleanField(default=False)
    error = models.JSONField(null=True, blank=True)
    prefix_sha256 = models.CharField(max_length=64, null=True, blank=True)
    lease_epoch = models.BigIntegerField(default=0)
    started_at = models.DateTimeField(default=utcnow)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "model_calls"
        constraints = [
            models.UniqueConstraint(fields=["run", "step_number", "attempt_number"], name="model_call_attempt_unique")
        ]


class ToolInvocation(models.Model):
    STATUSES = choices(InvocationStatus)
    OUTCOMES = choices(InvocationOutcome)  # pipeline step 11

    id = models.UUIDField(primary_key=True, default=new_uuid, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, db_index=False, db_constraint=False)
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="invocations", db_index=False, db_constraint=False
    )
    step_number = models.IntegerField()
    call_index = models.IntegerField()
    call_id = models.CharField(max_length=200)
    tool_name = models.CharField(max_length=200)
    arguments = models.JSONField(null=True, blank=True)
    raw_arguments = models.TextField(default="", blank=True)
    # Unique by a constraint, not `unique=True`: on PostgreSQL the field option
    # adds a second, varchar_pattern_ops index for LIKE that no query uses.
    idempotency_key = models.CharField(max_length=300)
    status = models.CharField(max_length=20, choices=STATUSES, default=InvocationStatus.PROPOSED.value)
    read_only = models.BooleanField(default=True)
    side_effect = models.CharField(max_length=40, default="none")
    effect_sent_at = models.DateTimeField(null=True, blank=True)
    attempt = models.IntegerField(default=0)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    suspended_kind = models.CharField(max_length=40, null=True, blank=True)
    # How the last attempt ended (succeeded / failed / uncertain), and every
    # attempt's outcome in order (an approved re-run keeps attempt 1's record).
    outcome = models.CharField(max_length=12, choices=OUTCOMES, null=True, blank=True)
    attempts = models.JSONField(null=True, blank=True)
    lease_epoch = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(default=utcnow)
    updated_at = models.DateTimeField(default=utcnow)

    class Meta:
        db_table = "tool_invocations"
        constraints = [
            models.UniqueConstraint(fields=["run", "step_number", "call_index"], name="invocation_position_unique"),
            models.UniqueConstraint(fields=["idempotency_key"], name="tool_invocations_idempotency_key_key"),
        ]


class Event(models.Model):
    """The session-scoped append-only log; `sequence` is the stream cursor."""

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, db_index=False, db_constraint=False)
    session = models.ForeignKey(
        Session, on_delete=models.CASCADE, related_name="events", db_index=False, db_constraint=False
    )
    sequence = models.BigIntegerField()
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, null=True, related_name="events", db_index=False, db_constraint=False
    )
    type = models.CharField(max_length=64)
    payload = models.JSONField(default=dict)
    lease_epoch = models.BigIntegerField(default=0)
    occurred_at = models.DateTimeField(default=utcnow)

    class Meta:
        db_table = "events"
        constraints = [models.UniqueConstraint(fields=["session", "sequence"], name="event_session_sequence_unique")]
        indexes = [
            models.Index(fields=["run", "sequence"], name="events_run_sequence_idx"),
            # The tenant's runs socket streams status events only: the other
            # types (most of a step's events) need no entry here.
            models.Index(fields=["tenant", "id"], name="events_tenant_status_idx", condition=Q(type__in=STATUS_TYPES)),
        ]
