"""The maintenance role: run each sweep at its cadence; safe on every node."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.conf import settings
from django.db import close_old_connections

from maintenance.sweeps.deliveries import sweep_deliveries
from maintenance.sweeps.expiry import sweep_expiry
from maintenance.sweeps.metrics import sweep_metrics
from maintenance.sweeps.prune import sweep_prune
from maintenance.sweeps.reclaim import sweep_dead_owners, sweep_reclaim
from maintenance.sweeps.retention import sweep_retention
from maintenance.sweeps.tokens import sweep_tokens
from runs.clock import CLOCK
from runs.runtime.backoff import Backoff

log = logging.getLogger("agentrt.maintenance")


def cadences() -> list[tuple[str, float, Callable[[], dict]]]:
    lease = float(settings.AGENTRT_LEASE_SECONDS)
    probe = float(settings.AGENTRT_DEAD_OWNER_PROBE_SECONDS)
    return [
        *([("dead_owners", probe, sweep_dead_owners)] if probe > 0 else []),
        ("reclaim", lease / 6, sweep_reclaim),
        ("expiry", min(5.0, lease / 3), sweep_expiry),
        ("prune", 300.0, sweep_prune),
        ("deliveries", float(settings.AGENTRT_DELIVERY_SWEEP_SECONDS), sweep_deliveries),
        ("tokens", 300.0, sweep_tokens),
        ("metrics", 10.0, sweep_metrics),
        ("retention", 300.0, sweep_retention),
    ]


def run_once() -> dict:
    return {name: fn() for name, _, fn in cadences()}


def run_forever(stop=lambda: False, clock=CLOCK) -> None:
    """Run each sweep at its cadence until `stop()`. A sweep that failed (the
    database unreachable, say) stays due, and an iteration with a failure
    waits longer each time, from the tick up to 30 s, instead of retrying
    every tick; one clean iteration resets it."""
    last: dict[str, float] = {}
    tick = min(every for _, every, _ in cadences()) / 2
    backoff = Backoff(tick)
    while not stop():
        now = clock.monotonic()
        failed = False
        for name, every, fn in cadences():
            if now - last.get(name, -1e9) >= every:
                try:
                    close_old_connections()
                    result = fn()
                    last[name] = now  # a failed sweep stays due: it is tried again after the backoff
                    if any(v for k, v in result.items() if k not in ("at", "skipped", "expired", "runs", "outcomes")):
                        log.info("sweep %s: %s", name, result)
                except Exception:
                    failed = True
                    log.exception("sweep %s failed", name)
        if failed:
            clock.sleep(max(tick, backoff.failed()))
        else:
            backoff.succeeded()
            clock.sleep(tick)
