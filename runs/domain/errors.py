"""Errors the runtime core raises; retryability is a class attribute."""

from __future__ import annotations

from typing import Any

from runs.domain.values import CancelReason, FailureReason, ModelUsage, RunUsage


class RuntimeCoreError(Exception):
    """Base error of the runtime core."""

    retryable = False
    reason: FailureReason = FailureReason.INTERNAL_ERROR


class WorkerFenced(RuntimeCoreError):
    """The lease was lost: stop at once and write nothing but `run.fenced`."""

    def __init__(self, message: str = "lease lost", *, late: dict[str, Any] | None = None):
        super().__init__(message)
        self.late = late


class PolicyChanged(RuntimeCoreError):
    """The policy in force when an approved call was about to be marked
    executing no longer allows it (the tenant's floor was tightened since the
    approval): the watermark's transaction wrote nothing."""

    def __init__(self, decision: str):
        super().__init__(f"the policy in force now says {decision!r} for this call")
        self.decision = decision


class RunCancelled(RuntimeCoreError):
    """The cancellation token was observed set."""

    def __init__(self, reason: CancelReason):
        super().__init__(f"cancelled: {reason}")
        self.cancel_reason = reason


class BudgetExceeded(RuntimeCoreError):
    """A limit was reached; permanent, never requeued."""

    usage: RunUsage | None = None  # the totals after the attempt that went over, when recording it did

    def __init__(self, reason: FailureReason, message: str, **details: Any):
        super().__init__(message)
        self.reason = reason
        self.details = details
        self.usage: Any = None  # the usage that crossed the limit, when the ledger knows it


class ModelError(RuntimeCoreError):
    """A model attempt failed; the provider classifies it. `usage` is what the
    failed attempt spent (reported, or estimated by the provider), charged
    like any attempt's (failed attempts count against the budget)."""

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
    the call `uncertain` (pipeline step 11)."""

    def __init__(
        self, code: str = "outcome_unknown", message: str = "the call may have taken effect; its outcome is unknown"
    ):
        super().__init__(code, message, uncertain=True)


class InputRequired(RuntimeCoreError):
    """A tool that cannot run until the run's user answers (an MCP server's
    `InputRequiredResult`): nothing took effect. `question` is shown to the
    user; `handle` (JSON) is kept in the call's record and handed back with
    the answer (`ToolExecutionContext.continued`) when the call is issued again."""

    def __init__(self, question: str, handle: dict[str, Any], details: dict[str, Any] | None = None):
        super().__init__(question)
        self.question = question
        self.handle = handle
        self.details = details or {}


class ToolLoopDetected(RuntimeCoreError):
    """The circuit breaker (ADR-0136): the model kept proposing the same call
    (same tool, same arguments) up to the identical-call threshold, or
    ignored the synthesis-only turn the breaker forced one call before it.
    Permanent: the run fails `tool_loop_detected` and is never requeued."""

    reason = FailureReason.TOOL_LOOP_DETECTED

    def __init__(self, tool: str, count: int, limit: int, *, ignored_synthesis: bool = False):
        if ignored_synthesis:
            message = f"the model kept calling tools ({tool!r}) after it was told to stop repeating a call and answer"
        else:
            message = f"the model proposed the same {tool!r} call {count} times (the limit is {limit})"
        super().__init__(message)
        self.details = {"tool": tool, "count": count, "limit": limit, "ignored_synthesis": ignored_synthesis}


class ReplayDiverged(RuntimeCoreError):
    """A replay's model proposed, at some position, another call than the
    original made there (another tool, other arguments, a call where it made
    none, none where it made one), or the same call whose outcome the original
    never learned. Permanent: the run fails `replay_diverged`; `details` holds
    the position, the reason and both calls."""

    reason = FailureReason.REPLAY_DIVERGED

    def __init__(self, message: str, **details: Any):
        super().__init__(message)
        self.details = details


class PrincipalRevoked(RuntimeCoreError):
    """At resumption after an approval or input, the principal the run acts
    for no longer may: the user was deactivated, deleted or removed from the
    run's tenant. Permanent: the run fails `principal_revoked` before any
    tool of the re-entered batch runs."""

    reason = FailureReason.PRINCIPAL_REVOKED

    def __init__(self, why: str):
        super().__init__(f"the run's principal was revoked: {why}")
        self.details = {"why": why}


class AgentVersionMissing(RuntimeCoreError):
    """The run's pinned agent version no longer exists. Permanent and loud:
    the run never falls back to the agent's latest version, which would run
    a definition the principal never submitted to."""

    reason = FailureReason.AGENT_VERSION_MISSING

    def __init__(self, agent: str, version: str):
        super().__init__(
            f"agent {agent!r} has no version {version[:12]}; the run is pinned to it and does not fall back to latest"
        )
        self.details = {"agent": agent, "agent_version": version}


class EndpointNotAllowed(RuntimeCoreError):
    """The model endpoint the run's pinned agent version names is not in its
    tenant's `allowed_endpoints` (narrowed since the version was published).
    Permanent: the run fails `endpoint_not_allowed` before the model is
    called (and before anything of a re-entered batch runs)."""

    reason = FailureReason.ENDPOINT_NOT_ALLOWED

    def __init__(self, endpoint: str):
        super().__init__(f"the model endpoint {endpoint!r} is not allowed for this tenant; nothing was sent to it")
        self.details = {"endpoint": endpoint}
