"""Errors of the runs services; each carries a stable code and an HTTP status.

Every app error (this module's, approvals/errors.py's, Resume's) derives from
`RunError` and exposes the same structured fields: `code` (stable, machine
readable: the API body's `code`), `status` (the HTTP status), `message` (for a
person; never raw exception text) and `fields` (`{"field.path": [messages]}`,
empty when the error is not about a field). runs/api/errors.py maps any of them
with these four and nothing else; pages and commands show `message`."""

from __future__ import annotations


class RunError(Exception):
    """Base error of the runs app."""

    code = "run_error"
    status = 400
    retryable = False

    def __init__(self, message: str, *, fields: dict[str, list[str]] | None = None):
        super().__init__(message)
        self.message = message
        self.fields: dict[str, list[str]] = fields or {}


class InvalidInput(RunError):
    """A field failed validation."""

    code = "invalid"


class AgentNotFound(RunError):
    """No agent of that name in the tenant."""

    code = "unknown_agent"


class TenantNotFound(RunError):
    """No tenant of that name."""

    code = "unknown_tenant"
    status = 404


class RunNotFound(RunError):
    """No run with that id in the caller's tenant."""

    code = "not_found"
    status = 404


class ActiveRunExists(RunError):
    """The session already has a non-terminal run."""

    code = "session_busy"
    status = 409


class IdempotencyConflict(RunError):
    """The Idempotency-Key was used with a different request."""

    code = "idempotency_key_reused"
    status = 409


class RunTerminal(RunError):
    """The run has already ended."""

    code = "run_terminal"
    status = 409


class QuotaExceeded(RunError):
    """The tenant already has as many active runs as its quota allows."""

    code = "quota_exceeded"
    status = 429


class ToolNotAllowed(RunError):
    """An agent names a tool its tenant's `allowed_tools` leaves out (fields: `tools`)."""

    code = "tool_not_allowed"


class EndpointNotAllowed(RunError):
    """An agent's model block names an endpoint its tenant's `allowed_endpoints`
    leaves out (fields: `model`)."""

    code = "endpoint_not_allowed"


class PublishForbidden(RunError):
    """The user lacks runs.publish_agent."""

    code = "permission_denied"
    status = 403


class RunLeased(RunError):
    """Another owner holds a live lease on the run."""

    code = "run_leased"
    status = 409


class RunNotRunning(RunError):
    """Resume applies only to a RUNNING run (not queued, waiting or ended)."""

    code = "run_not_running"
    status = 409


class RunNotFailed(RunError):
    """Retry applies only to a FAILED run."""

    code = "run_not_failed"
    status = 409


class RunNotRetryable(RunError):
    """The run failed for a reason a new attempt would not change (the message names it), it is a child run,
    or its deadline has passed."""

    code = "run_not_retryable"
    status = 409


class RunNotForkable(RunError):
    """The run cannot be forked or replayed: a child run (it runs under its parent's budget and policies), or
    one whose start is no longer recorded."""

    code = "run_not_forkable"
    status = 409


class RunNotFinished(RunError):
    """A replay is of a run that has ended."""

    code = "run_not_finished"
    status = 409


class RunNotWaitingForUser(RunError):
    """Input goes only to a run that waits for the user."""

    code = "run_not_waiting_for_input"
    status = 409


class RunWaitTimeout(RunError):
    """`wait_for_run`: the run did not settle within the timeout; it goes on regardless."""

    code = "run_wait_timeout"
    status = 408


class AddressRefused(OSError):
    """A host given by name resolved only to addresses an outbound request is
    never sent to (runs.net.routable): raised before any connection opens."""
