"""The system adapters of the Clock and IdFactory ports.

The only module of the runtime allowed to read ambient time or make random
ids; a structural test walks the AST of everything else.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

import uuid6


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class SystemIdFactory:
    def new_id(self) -> uuid.UUID:
        """A UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then 74 random
        bits (monotonic within the process). Rows inserted in time order land
        at the right edge of their primary-key index: with random (v4) ids,
        each step's model call and tool call rows went to a random leaf of a
        large table's index, read from disk and written to the WAL whole once
        per checkpoint cycle (bench/RESULTS.md). Still not
        guessable (74 random bits); it shows when the row was made, which
        every such row's `created_at` shows too."""
        return uuid.UUID(int=uuid6.uuid7().int)


CLOCK = SystemClock()
IDS = SystemIdFactory()


def new_uuid() -> uuid.UUID:
    """Model default for primary keys."""
    return IDS.new_id()


def utcnow() -> datetime:
    """Model default for timestamps."""
    return CLOCK.now()
