"""Fold the figures of the runs that ended into `metric_totals` (ops/fleet.py),
so a `/metrics` scrape reads the runs not folded yet, not the whole history.
A run is folded once it has been over for `SETTLED_SECONDS`; a sweep folds
batches until none is full or `BUDGET_SECONDS` have passed (a database
upgraded with millions of ended runs catches up over several sweeps)."""

from __future__ import annotations

from django.db import connection

from ops import fleet
from runs.clock import CLOCK

BATCH = 2000
SETTLED_SECONDS = 5.0
BUDGET_SECONDS = 10.0


def sweep_metrics() -> dict:
    if connection.vendor != "postgresql":
        return {"skipped": True}
    folded = 0
    ends = CLOCK.monotonic() + BUDGET_SECONDS
    while True:
        n = fleet.fold(BATCH, SETTLED_SECONDS)
        folded += n
        if n < BATCH or CLOCK.monotonic() >= ends:
            return {"folded_runs": folded}
