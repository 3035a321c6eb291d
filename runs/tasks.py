"""django-q2 task functions: doorbells only (DESIGN §5)."""

from uuid import UUID

from runs.runtime.executor import run_drive


def drive_run(run_id: str) -> str:
    """Claim the run and drive one slice of it, or exit quietly."""
    outcome = run_drive(run_id=UUID(run_id))
    return outcome.kind.value if outcome is not None else "not_claimed"
