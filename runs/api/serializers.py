"""Request serializers (strict: unknown and server-owned fields are refused,
strings must be strings, limits are checked by the pydantic model in strict
mode) and output serializers (their fields document the shapes for the
OpenAPI schema; the rendering itself is the selectors' REST shapes)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from uuid import UUID

from drf_spectacular.utils import extend_schema_field
from pydantic import ValidationError as PydanticValidationError
from rest_framework import serializers

from approvals.models import Approval
from approvals.selectors import approval_to_dict
from runs.domain.values import RunStatus
from runs.providers import PROVIDERS
from runs.services.agent_schema import AgentDefinition, Limits, forbidden_model_keys
from runs.services.selectors import event_to_dict, run_to_dict

# Columns the server owns: a client that sends one is told so (never honoured).
SERVER_OWNED = frozenset(
    {
        "id",
        "tenant",
        "tenant_id",
        "status",
        "lease_owner",
        "lease_epoch",
        "lease_expires_at",
        "lease_expirations",
        "attempts",
        "request_hash",
        "idempotency_key",
        "effect_sent_at",
        "usage",
        "step_count",
        "failure",
        "result",
        "final_message",
        "agent_version",
        "deadline_at",
        "cancel_requested_at",
        "created_at",
        "updated_at",
        "decided_by",
        "decided_at",
        "decided_via",
        "priority",
        "scheduled_for",
    }
)


def pydantic_fields(exc: PydanticValidationError, prefix: str = "") -> dict[str, list[str]]:
    """A pydantic error as `{"dotted.path": [messages]}` (union tags left out)."""
    tags = PROVIDERS.union_tags()
    fields: dict[str, list[str]] = {}
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"] if not (isinstance(p, str) and p in tags))
        fields.setdefault(prefix + loc if loc else (prefix[:-1] or "(root)"), []).append(err["msg"])
    return fields


def agent_definition_check(data: Any) -> None:
    """Validate an agent definition in pydantic's strict mode ("10" is not 10)."""
    if not isinstance(data, Mapping):
        raise serializers.ValidationError({"(root)": ["the agent definition must be a JSON object"]})
    forbidden = forbidden_model_keys(dict(data))  # a definition never chooses where a key goes
    try:
        AgentDefinition.model_validate(dict(data), strict=True)
    except PydanticValidationError as exc:
        raise serializers.ValidationError({**pydantic_fields(exc), **forbidden}) from None
    if forbidden:
        raise serializers.ValidationError(forbidden)


class StrictCharField(serializers.CharField):
    """A CharField that takes only strings (DRF's also takes numbers) and keeps whitespace."""

    def __init__(self, **kwargs):
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


@extend_schema_field({"type": "string", "format": "uuid"})
class StrictUUIDField(serializers.Field):
    """A UUID given as a string (DRF's UUIDField also takes integers)."""

    default_error_messages = {"invalid": "must be a UUID string"}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        try:
            return UUID(data)
        except ValueError:
            self.fail("invalid")

    def to_representation(self, value):
        return str(value)


@extend_schema_field(Limits)
class LimitsField(serializers.Field):
    """Run limits, validated by `runs.services.agent_schema.Limits` in strict mode."""

    default_error_messages = {"invalid": "must be an object"}

    def to_internal_value(self, data):
        if not isinstance(data, Mapping):
            self.fail("invalid")
        try:
            return Limits.model_validate(dict(data), strict=True).given()
        except PydanticValidationError as exc:
            raise serializers.ValidationError(pydantic_fields(exc)) from None

    def to_representation(self, value):
        return value


class StrictSerializer(serializers.Serializer):
    """Refuses keys it does not declare; server-owned ones are named as such."""

    def to_internal_value(self, data):
        unknown: dict[str, list[str]] = {}
        if isinstance(data, Mapping):
            for key in data:
                field = self.fields.get(key)
                if field is None or field.read_only:
                    unknown[key] = [
                        "read-only: set by the server"
                        if key in SERVER_OWNED or key.startswith("lease_")
                        else "unknown field"
                    ]
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            if unknown and isinstance(exc.detail, dict):
                raise serializers.ValidationError({**exc.detail, **unknown}) from None
            raise
        if unknown:
            raise serializers.ValidationError(unknown)
        return value


class Empty(StrictSerializer):
    """No fields: the body may be absent or `{}`."""


class RunCreate(StrictSerializer):
    """A run to submit: the agent's name, the user's input, optionally a session and tighter limits."""

    agent = StrictCharField(max_length=100, help_text="The agent's name.")
    input = StrictCharField(max_length=100_000, help_text="The user's message.")
    session = StrictUUIDField(required=False, allow_null=True, help_text="Continue this session (default: a new one).")
    limits = LimitsField(required=False, allow_null=True, help_text="May only tighten the agent's limits.")

    def validate_input(self, value):
        if not value.strip():
            raise serializers.ValidationError("must not be empty")
        return value


class InputText(StrictSerializer):
    """The user's answer to a run that waits for the user."""

    text = StrictCharField(max_length=100_000, help_text="The answer to the run's question.")

    def validate_text(self, value):
        if not value.strip():
            raise serializers.ValidationError("must not be empty")
        return value


class CancelRequest(StrictSerializer):
    """A cancel request: why, optionally (recorded on `run.cancel_requested` and `run.cancelled`)."""

    reason = StrictCharField(
        max_length=2000,
        required=False,
        allow_blank=True,
        allow_null=True,
        default=None,
        help_text="Why the run is cancelled (at most 2000 characters; secrets in it are scrubbed).",
    )


class StrictIntegerField(serializers.IntegerField):
    """An IntegerField that takes only JSON integers (DRF's also takes "3", 3.0 and true)."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


AGENT_VERSION_HELP = (
    "A version of the run's agent as the agents API shows it (its `id` or its `version`), or `latest`; "
    "default: the version the run is pinned to."
)


class ForkRequest(StrictSerializer):
    """Fork a run: continue its conversation after one of its steps."""

    from_step = StrictIntegerField(
        min_value=0, help_text="The fork's conversation is the run's through the end of this step (0: its start)."
    )
    agent_version = StrictCharField(
        max_length=64, required=False, allow_null=True, default=None, help_text=AGENT_VERSION_HELP
    )
    input = StrictCharField(
        max_length=100_000,
        required=False,
        allow_null=True,
        default=None,
        help_text="A user message added after that step (optional).",
    )
    effects = serializers.ChoiceField(
        choices=["approve", "policy"],
        required=False,
        default="approve",
        help_text="approve (default): every side-effect call of the fork waits for a person; policy: the agent's "
        "policy decides, as for a fresh run (needs `runs.publish_agent`).",
    )

    def validate_input(self, value):
        if value is not None and not value.strip():
            raise serializers.ValidationError("must not be empty")
        return value


class ReplayRequest(StrictSerializer):
    """Replay a run: call the model again, answer every call from the run's record."""

    agent_version = StrictCharField(
        max_length=64, required=False, allow_null=True, default=None, help_text=AGENT_VERSION_HELP
    )


class ApprovalDecision(StrictSerializer):
    """A decision, bound to the request_hash that was shown."""

    request_hash = StrictCharField(
        max_length=128, help_text="The request_hash that was shown (approve what was shown)."
    )
    reason = StrictCharField(max_length=2000, required=False, allow_blank=True, default="")


class StrictBooleanField(serializers.BooleanField):
    """A BooleanField that takes only JSON true/false (DRF's also takes "yes", 1, "on")."""

    default_error_messages = {"invalid": "must be a boolean (true or false)."}

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class ApprovalConfirmation(StrictSerializer):
    """The operator's word on an unknown outcome, bound to the request_hash that was shown."""

    request_hash = StrictCharField(max_length=128, help_text="The request_hash that was shown.")
    took_effect = StrictBooleanField(
        help_text="true: the call took effect; false: it did not. Nothing is sent again either way."
    )
    reason = StrictCharField(max_length=2000, required=False, allow_blank=True, default="")


# -- outputs (schema documentation; rendered from the selectors) -------------------


@extend_schema_field({})
class AnyJSON(serializers.JSONField):
    """Any JSON value, null included (documented as an unconstrained schema)."""


class UsageOut(serializers.Serializer):
    input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    cache_read_input_tokens = serializers.IntegerField()
    cache_creation_input_tokens = serializers.IntegerField()
    reasoning_tokens = serializers.IntegerField()
    cost_usd = serializers.FloatField()
    model_calls = serializers.IntegerField()
    tool_calls = serializers.IntegerField()
    steps = serializers.IntegerField()


class FailureOut(serializers.Serializer):
    reason = serializers.CharField(allow_null=True)
    error_class = serializers.CharField(allow_null=True)
    message = serializers.CharField(allow_null=True)
    step_number = serializers.IntegerField(allow_null=True)
    attempt_number = serializers.IntegerField(allow_null=True)
    occurred_at = serializers.CharField(allow_null=True)


class ChildRunOut(serializers.Serializer):
    id = serializers.UUIDField()
    agent = serializers.CharField(help_text="The child agent's name.")
    status = serializers.ChoiceField(choices=[s.value for s in RunStatus])


class ForkedFromOut(serializers.Serializer):
    run = serializers.UUIDField()
    step = serializers.IntegerField(help_text="The fork's conversation is the run's through the end of this step.")


class ForkOut(serializers.Serializer):
    id = serializers.UUIDField()
    step = serializers.IntegerField(help_text="The step it was forked from.")
    status = serializers.ChoiceField(choices=[s.value for s in RunStatus])
    agent_version = serializers.CharField()


class RunOut(serializers.Serializer):
    id = serializers.UUIDField()
    session = serializers.UUIDField()
    agent = serializers.CharField(help_text="The agent's name.")
    agent_version = serializers.CharField()
    status = serializers.ChoiceField(choices=[s.value for s in RunStatus])
    failure = FailureOut(allow_null=True)
    usage = UsageOut()
    step_count = serializers.IntegerField()
    final_message = serializers.CharField(allow_null=True)
    result = AnyJSON(help_text="A reconciler's completed result (any JSON), else null.")
    parent = serializers.UUIDField(
        allow_null=True, help_text="The run whose `delegate_run` call started this one; null for a submitted run."
    )
    children = ChildRunOut(many=True, help_text="The child runs this run started, in the order of its calls.")
    forked_from = ForkedFromOut(
        allow_null=True, help_text="The run and the step this run was forked from; null for a run that is no fork."
    )
    forks = ForkOut(many=True, help_text="The runs forked from this one, oldest first.")
    replay_of = serializers.UUIDField(allow_null=True, help_text="The run this run replays; null for no replay.")
    cancel_requested_at = serializers.DateTimeField(
        allow_null=True,
        help_text="When a cancel was first requested (null: never). Set on a run that then ended anyway — its "
        "events say why (`run.cancel_too_late`) — or that waits on an unknown outcome's decision.",
    )
    retryable = serializers.BooleanField(
        help_text="`POST /api/runs/{id}/retry/` would give this FAILED run a new attempt (a transient failure, "
        "not a child run, deadline not passed)."
    )
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    def to_representation(self, instance):
        return run_to_dict(instance)


class RoutedOut(serializers.Serializer):
    run = serializers.UUIDField(help_text="The session's run that was waiting for the user.")
    routed = serializers.ChoiceField(choices=["input"])


class EventOut(serializers.Serializer):
    sequence = serializers.IntegerField()
    type = serializers.CharField()
    run = serializers.UUIDField(allow_null=True)
    payload = serializers.DictField()
    occurred_at = serializers.DateTimeField()

    def to_representation(self, instance):
        return event_to_dict(instance)


class EventsPageOut(serializers.Serializer):
    results = EventOut(many=True)
    next_after = serializers.IntegerField(
        allow_null=True, help_text="Pass as `after` for the next page; null when there is none."
    )


class ResumeOut(serializers.Serializer):
    outcome = serializers.CharField(help_text="continue, waiting, completed, failed or fenced.")


class AgentVersionOut(serializers.Serializer):
    id = serializers.UUIDField()
    agent = serializers.CharField(help_text="The agent's name.")
    version = serializers.CharField(help_text="SHA-256 of the canonical definition.")
    policy_version = serializers.CharField()
    latest = serializers.BooleanField(help_text="Whether new runs of the agent use this version.")
    definition = serializers.DictField()
    published_by = serializers.CharField(
        allow_null=True, help_text="Username of the publisher; null when loaded from the shell."
    )
    published_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()

    def to_representation(self, av):
        return {
            "id": str(av.id),
            "agent": av.agent.name,
            "version": av.version,
            "policy_version": av.policy_version,
            "latest": av.agent.latest_version == av.version,
            "definition": av.definition,
            "published_by": av.published_by.get_username() if av.published_by_id else None,
            "published_at": _iso(av.published_at),
            "created_at": _iso(av.created_at),
        }


class ApprovalOut(serializers.Serializer):
    id = serializers.UUIDField()
    run = serializers.UUIDField()
    invocation = serializers.UUIDField(allow_null=True)
    kind = serializers.ChoiceField(choices=[k for k, _ in Approval.KINDS])
    status = serializers.ChoiceField(choices=[s for s, _ in Approval.STATUSES])
    request_hash = serializers.CharField(help_text="Send it back with the decision.")
    presentation = serializers.DictField(
        help_text="What the operator is shown: tool, arguments, side-effect class, notice."
    )
    expires_at = serializers.DateTimeField(
        allow_null=True, help_text="Null for an unknown outcome's approval: no timer closes one."
    )
    deadline_passed = serializers.BooleanField(help_text="Whether the run's deadline has passed.")
    decisions = serializers.ListField(
        child=serializers.ChoiceField(choices=["approve", "reject", "confirm"]),
        help_text="The decisions accepted now (empty once decided). An unknown outcome whose run cannot go on "
        "(deadline passed, budget spent, cancel requested) offers only confirm and reject.",
    )
    ends_run = serializers.CharField(
        allow_null=True,
        help_text="For a pending unknown outcome whose run cannot go on: how the run ends after the decision "
        "(`deadline_exceeded`, `budget_exceeded`, `cancelled`); else null.",
    )
    decided_by = serializers.CharField(allow_null=True, help_text="Username of the decider.")
    decided_at = serializers.DateTimeField(allow_null=True)
    decided_via = serializers.ChoiceField(choices=[s for s, _ in Approval.SURFACES], allow_null=True)
    reason = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()

    def to_representation(self, a):
        return approval_to_dict(a)


class ErrorOut(serializers.Serializer):
    code = serializers.CharField(help_text="Stable machine-readable code, e.g. invalid, not_found, run_terminal.")
    message = serializers.CharField()
    fields = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="Field path → messages, when fields are at fault.",
    )
    request_id = serializers.CharField(help_text="Echoes a sane X-Request-ID, else generated.")


def _iso(dt) -> str | None:
    return dt.isoformat().replace("+00:00", "Z") if dt else None
