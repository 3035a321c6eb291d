"""The tool pipeline: fourteen steps for every proposed call.

Steps 1–8 decide every call of the batch in memory and are committed with the
model response (commit 1 of the step). Read-only calls then run; each
side-effect call first commits its watermark alone (step 9). Results, their
events and the conversation entries go into the next unit of work (commit 2).
Nothing a model proposes can raise out of here: every malformed call ends as
a recorded tool result.

The package by concern: `context` (what a tool is given), `batch` (what the
steps share), `decide` (steps 1–8), `execute` (steps 9–14), `control` (the
control tools `ask_user` and `delegate_run`) and `reentry` (an open batch
re-entered after a takeover or a decision). The names the rest of the
project uses are re-exported here.
"""

from runs.domain.pipeline.batch import (
    ANSWERED,
    DENIALS,
    MAX_ARGUMENT_BYTES,
    MAX_DELEGATION_DEPTH,
    RERUN_KINDS,
    UNKNOWN_OUTCOME,
    BatchResult,
    RerunConflict,
    UnknownOutcome,
    _call_fingerprint,
)
from runs.domain.pipeline.context import CancelSignal, ToolExecutionContext
from runs.domain.pipeline.decide import dispatch
from runs.domain.pipeline.reentry import open_batch, resume_batch

__all__ = [
    "ANSWERED",
    "DENIALS",
    "MAX_ARGUMENT_BYTES",
    "MAX_DELEGATION_DEPTH",
    "RERUN_KINDS",
    "UNKNOWN_OUTCOME",
    "BatchResult",
    "CancelSignal",
    "RerunConflict",
    "ToolExecutionContext",
    "UnknownOutcome",
    "_call_fingerprint",
    "dispatch",
    "open_batch",
    "resume_batch",
]
