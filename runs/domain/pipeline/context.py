"""What a tool is given: its execution context and the run's cancellation as it sees it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from runs.domain.ports import CancellationToken, Clock
from runs.domain.values import (
    CancelReason,
)

_NEVER = threading.Event()  # never set: a plain bounded wait


class CancelSignal:
    """The run's cancellation as a tool sees it: true once the run is
    cancelled by an operator or its deadline passes; `wait(seconds)` blocks
    until then or the timeout and returns whether it was cancelled. A worker
    that lost its lease (`fenced`) is not a cancelled run: its running tool
    finishes and the outcome is recorded late, so the signal stays
    clear for it."""

    __slots__ = ("_token",)

    def __init__(self, token: CancellationToken):
        self._token = token

    def is_set(self) -> bool:
        return self._token.reason not in (None, CancelReason.FENCED)

    __bool__ = is_set

    @property
    def reason(self) -> CancelReason | None:
        return self._token.reason if self.is_set() else None

    def wait(self, seconds: float | None = None) -> bool:
        if self._token.wait(seconds) is CancelReason.FENCED:
            _NEVER.wait(seconds)
        return self.is_set()


@dataclass
class ToolExecutionContext:
    """What a tool is given (pipeline step 10): the run, the step, the
    idempotency key, the attempt, the run's `deadline` (absolute, or None),
    the `cancelled` signal and the `principal` the run acts for.
    `step_number` and `token` stay as aliases of `step` and the raw token.

    For a tool whose work outlives one request (an MCP server's task or
    question): `record(handle)` keeps `handle` (JSON) in the call's record in
    a committed, fenced transaction before it returns (None for a read-only
    call: running it again is harmless); `report(payload)` writes a
    `tool.call.progress` event; `continued` is what an earlier attempt of
    this call left for this one (the handle of its question and the user's
    `answer`), or None."""

    run_id: UUID
    step_number: int
    call_id: str
    invocation_id: UUID | None
    idempotency_key: str
    attempt: int
    timeout_seconds: float
    token: CancellationToken
    deadline: datetime | None = None
    principal: Any = None
    clock: Clock | None = None
    record: Callable[[dict[str, Any]], None] | None = None
    report: Callable[[dict[str, Any]], None] | None = None
    continued: dict[str, Any] | None = None

    @property
    def step(self) -> int:
        return self.step_number

    @property
    def cancelled(self) -> CancelSignal:
        return CancelSignal(self.token)

    def seconds_left(self) -> float | None:
        """Seconds until the run's deadline (never negative), or None."""
        if self.deadline is None or self.clock is None:
            return None
        return max(0.0, (self.deadline - self.clock.now()).total_seconds())

    def time_budget(self) -> float:
        """This call's timeout bounded by the run's deadline."""
        left = self.seconds_left()
        return self.timeout_seconds if left is None else min(self.timeout_seconds, left)
