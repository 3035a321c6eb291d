"""Checkpoint prune: a terminal run keeps its final full snapshot; the chain
before it is needed by nothing."""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models import F, Max, Subquery

from checkpoints.models import Checkpoint
from maintenance.locks import try_sweep_lock
from runs.models import TERMINAL, Run

BATCH = 200

log = logging.getLogger("agentrt.maintenance")


def sweep_prune() -> dict:
    with transaction.atomic():
        if not try_sweep_lock("sweep.checkpoints"):
            return {"skipped": True}
        candidates = list(
            Run.objects.filter(status__in=TERMINAL, checkpoints__full=True)
            .annotate(n=Max("checkpoints__version"))
            .values_list("id", flat=True)
            .distinct()[: BATCH * 5]
        )
    deleted = failed = 0
    for run_id in candidates:
        try:
            deleted += _prune_run(run_id)
        except Exception as exc:
            # Each run is its own transaction (rolled back): log the run and the error class only — never
            # checkpoint content or the exception's text — and go on with the other runs (seed 002).
            failed += 1
            log.warning("prune: run %s failed (%s); its checkpoints are kept", run_id, type(exc).__name__)
    return {"runs": len(candidates), "deleted": deleted, "failed": failed}


def _prune_run(run_id) -> int:
    """One DELETE: the versions before the run's final full snapshot, only if
    that snapshot is also its last version (a terminal run without its final
    snapshot keeps its chain for diagnosis). No transaction spans two
    statements, so a process starved between them cannot hold one open."""
    versions = Checkpoint.objects.filter(run_id=run_id).order_by("-version").values("version")
    n, _ = (
        Checkpoint.objects.filter(run_id=run_id)
        .annotate(final=Subquery(versions.filter(full=True)[:1]), top=Subquery(versions[:1]))
        .filter(version__lt=F("final"), final=F("top"))
        .delete()
    )
    return n
