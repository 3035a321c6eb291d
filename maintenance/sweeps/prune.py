"""Checkpoint prune: a terminal run keeps its final full snapshot; the chain
before it is needed by nothing."""

from __future__ import annotations

from django.db import transaction
from django.db.models import Max

from checkpoints.models import Checkpoint
from maintenance.locks import try_sweep_lock
from runs.models import TERMINAL, Run

BATCH = 200


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
    deleted = 0
    for run_id in candidates:
        with transaction.atomic():
            final = (
                Checkpoint.objects.filter(run_id=run_id, full=True)
                .order_by("-version")
                .values_list("version", flat=True)
                .first()
            )
            top = Checkpoint.objects.filter(run_id=run_id).aggregate(v=Max("version"))["v"]
            if final is None or final != top:
                continue  # a terminal run without its final snapshot keeps its chain for diagnosis
            n, _ = Checkpoint.objects.filter(run_id=run_id, version__lt=final).delete()
            deleted += n
    return {"runs": len(candidates), "deleted": deleted}
