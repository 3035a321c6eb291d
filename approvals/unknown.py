"""How a run waiting on an unknown outcome ends.

An unknown outcome's approval (`approvals.models.UNKNOWN_OUTCOME_KINDS`: an
interrupted or uncertain side effect, or the reconciler's pause of one) is
closed only by a person's decision. When the run cannot go on after that
decision — its deadline passed, its budget is spent (what `execute_run`
checks before anything runs: the deadline and the cost limit), or a cancel
was requested while the question was open — the run keeps waiting and offers
only `confirm` and `reject`: `approve` would send the call again for a run
that can do nothing with the answer (409 `run_deadline_passed`,
`run_budget_exhausted`, `run_cancel_requested`). After the decision the run
ends at once, in the decision's transaction: FAILED `deadline_exceeded` (or
the budget's reason), or CANCELLED, with the outcome recorded on the
invocation (`approvals.services`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from approvals.errors import ApprovalError, RunBudgetExhausted, RunCancelRequested, RunDeadlinePassed
from approvals.models import CONFIRMABLE_KINDS, UNKNOWN_OUTCOME_KINDS
from runs.domain.budgets import Ledger
from runs.domain.errors import BudgetExceeded
from runs.domain.values import BudgetScope, FailureReason, RunFailure, RunLimits, RunUsage

CANCELLED = "cancelled"


@dataclass(frozen=True)
class Closing:
    """Why a run waiting on an unknown outcome cannot go on after the decision."""

    reason: str  # a FailureReason value, or "cancelled"
    message: str
    error_class: str = ""

    @property
    def cancelled(self) -> bool:
        return self.reason == CANCELLED

    def refusal(self) -> ApprovalError:
        """The answer to an `approve` (a re-run) on this run."""
        then = " Confirm whether the call took effect, or reject it; the run then ends."
        if self.cancelled:
            return RunCancelRequested("a cancel of this run was requested: the call is not sent again." + then)
        if self.reason == FailureReason.DEADLINE_EXCEEDED.value:
            return RunDeadlinePassed("the run's deadline has passed: the call is not sent again." + then)
        return RunBudgetExhausted(f"the run's budget is exhausted ({self.message}): the call is not sent again." + then)


def deadline_passed(run, now: datetime) -> bool:
    return run.deadline_at is not None and run.deadline_at <= now


def run_closing(run, now: datetime) -> Closing | None:
    """Why `run` (a waiting run, its row read under its lock) cannot go on, or
    None. A cancel requested before the deadline passed ends it CANCELLED; a
    deadline passed first, FAILED `deadline_exceeded`; else a spent budget."""
    late = deadline_passed(run, now)
    if run.cancel_requested_at is not None and not (late and run.deadline_at <= run.cancel_requested_at):
        return Closing(CANCELLED, "a cancel was requested while the outcome was unknown")
    if late:
        return Closing(
            FailureReason.DEADLINE_EXCEEDED.value,
            "the run deadline passed while an unknown outcome waited for a decision",
            "RunDeadlineExceeded",
        )
    try:
        limits, usage = RunLimits(**(run.limits or {})), RunUsage(**(run.usage or {}))
    except Exception:  # a record that will not decode: Resume refuses it when the run goes on, not here
        return None
    try:
        Ledger(limits, run.deadline_at).check(usage, BudgetScope.ADMISSION, step_number=run.step_count + 1, now=now)
    except BudgetExceeded as exc:
        return Closing(exc.reason.value, str(exc), "BudgetExceeded")
    return None


def decisions_open(approval, run, now: datetime) -> list[str]:
    """The decisions `approval` accepts now (the REST `decisions`, the run
    page's buttons): none once decided, expired or when its run no longer
    waits; `confirm` only for an interrupted or uncertain side effect; no
    `approve` of an unknown outcome whose run cannot go on."""
    if approval.status != "pending" or run.status != "WAITING_FOR_APPROVAL":
        return []
    unknown = approval.kind in UNKNOWN_OUTCOME_KINDS
    if not unknown and approval.expires_at is not None and approval.expires_at <= now:
        return []
    out = ["approve", "reject"] + (["confirm"] if approval.kind in CONFIRMABLE_KINDS else [])
    if unknown and run_closing(run, now) is not None:
        out.remove("approve")
    return out


def ends_run(approval, run, now: datetime) -> str | None:
    """How the run ends after this pending unknown outcome's decision, when it
    cannot go on (`deadline_exceeded`, a budget's reason, `cancelled`); None
    when it goes on (or the approval is not an open unknown outcome)."""
    if approval.status != "pending" or approval.kind not in UNKNOWN_OUTCOME_KINDS:
        return None
    closing = run_closing(run, now)
    return closing.reason if closing is not None else None


def closing_failure(closing: Closing, now: datetime, details: dict[str, Any]) -> dict[str, Any]:
    """The run's `failure` for a closing that fails it (not a cancel)."""
    return RunFailure(
        reason=FailureReason(closing.reason),
        error_class=closing.error_class or "RunFailed",
        message=closing.message,
        occurred_at=now,
        details=details,
    ).as_json()
