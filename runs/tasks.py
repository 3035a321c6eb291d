"""django-q2 task functions: doorbells only."""

import gc
from uuid import UUID

from runs.runtime.executor import run_drive

_heap_frozen = False


def drive_run(run_id: str) -> str:
    """Claim the run and drive one slice of it, or exit quietly."""
    try:
        outcome = run_drive(run_id=UUID(run_id))
    finally:
        _freeze_heap_once()
    return outcome.kind.value if outcome is not None else "not_claimed"


def _freeze_heap_once() -> None:
    """After a worker process's first task, when Django, the apps, the
    providers and the tools are all imported: collect once, then move every
    object left out of the cyclic collector's reach (`gc.freeze`). Those
    objects live as long as the process anyway; without this, each of the
    collector's older-generation passes walks all of them again, about 8 %
    of a read-only step in bench/RESULTS.md. Objects created
    later are collected as before."""
    global _heap_frozen
    if not _heap_frozen:
        _heap_frozen = True
        gc.collect()
        gc.freeze()
