"""Backoff for a durable worker's infrastructure failures.

Consecutive failures (the queue or the database cannot be read) wait
exponentially longer, from the poll interval up to a 30-second ceiling,
instead of retrying at a fixed short delay; one successful iteration resets
the allowance. The delay is computed here and slept on the caller's injected
clock (runs/clock.py, a fake in tests)."""

from __future__ import annotations

MAX_BACKOFF_SECONDS = 30.0


class Backoff:
    def __init__(self, base: float, cap: float = MAX_BACKOFF_SECONDS):
        self.base = max(base, 0.001)
        self.cap = cap
        self.failures = 0

    def failed(self) -> float:
        """Count one more consecutive failure; return how long to wait before the next try."""
        self.failures += 1
        return min(self.cap, self.base * 2 ** (self.failures - 1))

    def succeeded(self) -> None:
        self.failures = 0
