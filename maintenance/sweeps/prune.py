"""Checkpoint prune: a terminal run keeps its final full snapshot; the chain
before it is needed by nothing."""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models import Max

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
    with transaction.atomic():
        final = (
            Checkpoint.objects.filter(run_id=run_id, full=True)
            .order_by("-version")
            .values_list("version", flat=True)
            .first()
        )
        top = Checkpoint.objects.filter(run_id=run_id).aggregate(v=Max("version"))["v"]
        if final is None or final != top:
            return 0  # a terminal run without its final snapshot keeps its chain for diagnosis
        n, _ = Checkpoint.objects.filter(run_id=run_id, version__lt=final).delete()
        return n
