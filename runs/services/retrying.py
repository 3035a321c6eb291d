"""Which failed runs a retry may give a new attempt (the
retry itself is runs.runtime.retry): a plain predicate over the run's row,
shared by the retry, the run JSON's `retryable` and the pages' Retry action."""

from __future__ import annotations

from datetime import datetime

from runs.clock import CLOCK
from runs.domain.values import FailureReason
from runs.errors import RunError, RunNotFailed, RunNotRetryable

# The failures another attempt can change: the model kept failing transiently, the runtime hit an unexpected
# error, the run's workers kept dying. Any other reason (a budget, the deadline, a policy, the model refusing
# the request, a conflict) would fail the same way again.
RETRYABLE = (
    FailureReason.DEPENDENCY_UNAVAILABLE.value,
    FailureReason.INTERNAL_ERROR.value,
    FailureReason.MAX_ATTEMPTS_EXCEEDED.value,
)


def retry_refusal(run, now: datetime | None = None) -> RunError | None:
    """Why `run` cannot be retried now (409 `run_not_failed` or
    `run_not_retryable`, naming the failure reason), or None."""
    if run.status != "FAILED":
        return RunNotFailed(f"the run is {run.status}; only a FAILED run can be retried")
    reason = (run.failure or {}).get("reason")
    if reason not in RETRYABLE:
        return RunNotRetryable(
            f"the run failed {reason}, which another attempt would not change; only {', '.join(RETRYABLE)} are retried"
        )
    if run.detail_removed_at is not None:
        return RunNotRetryable(
            "the run's detail (its checkpoints, events and tool calls) was removed by retention: "
            "there is no checkpoint to continue from"
        )
    if run.parent_id is not None:
        return RunNotRetryable("a child run is not retried: its parent's model was already told that it failed")
    if run.deadline_at is not None and run.deadline_at <= (now or CLOCK.now()):
        return RunNotRetryable("the run's deadline has passed: another attempt would fail deadline_exceeded at once")
    return None


def retryable(run) -> bool:
    return retry_refusal(run) is None
