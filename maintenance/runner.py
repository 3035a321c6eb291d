"""The maintenance role: run each sweep at its cadence; safe on every node."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import close_old_connections

from maintenance.sweeps.deliveries import sweep_deliveries
from maintenance.sweeps.expiry import sweep_expiry
from maintenance.sweeps.prune import sweep_prune
from maintenance.sweeps.reclaim import sweep_reclaim
from runs.clock import CLOCK

log = logging.getLogger("agentrt.maintenance")


def cadences() -> list[tuple[str, float, callable]]:
    lease = float(settings.AGENTRT_LEASE_SECONDS)
    return [
        ("reclaim", lease / 6, sweep_reclaim),
        ("expiry", min(5.0, lease / 3), sweep_expiry),
        ("prune", 300.0, sweep_prune),
        ("deliveries", float(settings.AGENTRT_DELIVERY_SWEEP_SECONDS), sweep_deliveries),
    ]


def run_once() -> dict:
    return {name: fn() for name, _, fn in cadences()}


def run_forever(stop=lambda: False) -> None:
    last: dict[str, float] = {}
    while not stop():
        now = CLOCK.monotonic()
        for name, every, fn in cadences():
            if now - last.get(name, -1e9) >= every:
                last[name] = now
                try:
                    close_old_connections()
                    result = fn()
                    if any(v for k, v in result.items() if k not in ("at", "skipped", "expired", "runs", "outcomes")):
                        log.info("sweep %s: %s", name, result)
                except Exception:
                    log.exception("sweep %s failed", name)
        CLOCK.sleep(min(every for _, every, _ in cadences()) / 2)
