"""Errors of the approval service, with their HTTP status and stable code."""

from runs.errors import RunError


class ApprovalError(RunError):
    """Base error of the approvals app."""

    code = "approval_error"
    status = 400


class ApprovalNotFound(ApprovalError):
    """No approval with that id in the caller's tenant."""

    code = "not_found"
    status = 404


class ApprovalForbidden(ApprovalError):
    """The user lacks approvals.resolve_approval."""

    code = "permission_denied"
    status = 403


class ApprovalDecided(ApprovalError):
    """The approval was already decided."""

    code = "approval_decided"
    status = 409


class ApprovalStale(ApprovalError):
    """The decision carried a hash other than the approval's."""

    code = "approval_stale"
    status = 409


class ApprovalExpired(ApprovalError):
    """The approval expired before the decision."""

    code = "approval_expired"
    status = 409


class ApprovalNotConfirmable(ApprovalError):
    """Only an unknown outcome (interrupted or uncertain side effect) can be confirmed."""

    code = "approval_not_confirmable"
    status = 409


class RunDeadlinePassed(ApprovalError):
    """Approve (send the call again) on an unknown outcome after the run's deadline: only confirm or reject."""

    code = "run_deadline_passed"
    status = 409


class RunBudgetExhausted(ApprovalError):
    """Approve on an unknown outcome of a run whose budget is spent: only confirm or reject."""

    code = "run_budget_exhausted"
    status = 409


class RunCancelRequested(ApprovalError):
    """Approve on an unknown outcome of a run whose cancel was requested: only confirm or reject."""

    code = "run_cancel_requested"
    status = 409
