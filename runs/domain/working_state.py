"""The runtime's write of working state (context phase 10).

`apply_runtime_carry` is pure: it sets exactly four fields after each tool
batch — the step number, the last tool error's reason code, the count of
consecutive all-denied batches the breaker tracks, the outstanding question
id when the batch suspended on `ask_user` — and never anything the model
produced. The write is the checkpoint's: the loop copies the result onto the
checkpoint state, which the next checkpoint persists. `working_note` is how
the request builder uses it: a short runtime note at the end of the request
(derived from the checkpoint alone, so two builds stay byte-identical).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_DENIED_BATCHES = 3  # consecutive all-denied batches that fail the run `repeated_denial`


@dataclass(frozen=True, slots=True)
class WorkingState:
    step: int = 0
    last_tool_error: str | None = None  # reason code of the last failed call of the latest batch
    consecutive_denials: int = 0
    question_id: str | None = None  # the ask_user invocation waiting for an answer


@dataclass(frozen=True, slots=True)
class BatchDisposition:
    """What the carry reads of a finished (or suspended) batch."""

    error_codes: tuple[str, ...] = ()  # of its failed calls, in call order
    all_denied: bool = False
    question_id: str | None = None


def apply_runtime_carry(state: WorkingState, disposition: BatchDisposition, step: int) -> WorkingState:
    return WorkingState(
        step=step,
        last_tool_error=disposition.error_codes[-1] if disposition.error_codes else None,
        consecutive_denials=state.consecutive_denials + 1 if disposition.all_denied else 0,
        question_id=disposition.question_id,
    )


def working_note(state: WorkingState) -> str | None:
    """The runtime's note for the model, or None when there is nothing to say."""
    parts = []
    if state.last_tool_error:
        parts.append(f"the last tool call of step {state.step} failed ({state.last_tool_error})")
    if state.consecutive_denials:
        left = max(MAX_DENIED_BATCHES - state.consecutive_denials, 0)
        parts.append(
            f"policy denied every call of the last {state.consecutive_denials} step(s); "
            f"{left} more such step(s) end the run"
        )
    if state.question_id:
        parts.append(f"question {state.question_id} is waiting for the user's answer")
    if not parts:
        return None
    return "[runtime] Working state: " + "; ".join(parts) + "."
