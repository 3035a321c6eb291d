"""Errors the runtime core raises; retryability is a class attribute."""

from __future__ import annotations

from typing import Any

from runs.domain.values import CancelReason, FailureReason, ModelUsage


class RuntimeCoreError(Exception):
    """Base error of the runtime core."""

    retryable = False
    reason: FailureReason = FailureReason.INTERNAL_ERROR


class WorkerFenced(RuntimeCoreError):
    """The lease was lost: stop at once and write nothing but `run.fenced`."""

    def __init__(self, message: str = "lease lost", *, late: dict[str, Any] | None = None):
        super().__init__(message)
        self.late = late


class RunCancelled(RuntimeCoreError):
    """The cancellation token was observed set."""

    def __init__(self, reason: CancelReason):
        super().__init__(f"cancelled: {reason}")
        self.cancel_reason = reason


class BudgetExceeded(RuntimeCoreError):
    """A limit was reached; permanent, never requeued."""

    def __init__(self, reason: FailureReason, message: str, **details: Any):
        super().__init__(message)
        self.reason = reason
        self.details = details


class ModelError(RuntimeCoreError):
    """A model attempt failed; the provider classifies it. `usage` is what the
    failed attempt spent (reported, or estimated by the provider), charged
    like any attempt's (seed 002: failed attempts count against budget)."""

    def __init__(
        self,
        error_class: str,
        message: str,
        *,
        transient: bool,
        stream_had_output: bool = False,
        usage: ModelUsage | None = None,
    ):
        super().__init__(message)
        self.error_class = error_class
        self.retryable = transient
        self.stream_had_output = stream_had_output
        self.usage = usage


class EmptyModelTurn(RuntimeCoreError):
    """The model returned no text and no tool calls; retried as a failed step."""

    retryable = True
    reason = FailureReason.EMPTY_MODEL_TURN


class RunDrain(RuntimeCoreError):
    """The slice ended or the worker is draining: yield the run back to QUEUED."""


class ToolFailure(RuntimeCoreError):
    """A tool outcome the model should see as an error result."""

    def __init__(self, code: str, message: str, *, uncertain: bool = False):
        super().__init__(message)
        self.code = code
        self.uncertain = uncertain


class OutcomeUnknown(ToolFailure):
    """A tool's outcome is unknown: the request may have taken effect (it was
    sent and no answer came, the call timed out or was cancelled while
    running). Public as `runs.tools.OutcomeUnknown`; the pipeline classifies
    the call `uncertain` (DESIGN §7 step 11)."""

    def __init__(
        self, code: str = "outcome_unknown", message: str = "the call may have taken effect; its outcome is unknown"
    ):
        super().__init__(code, message, uncertain=True)
