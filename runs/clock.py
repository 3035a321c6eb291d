"""The system adapters of the Clock and IdFactory ports.

The only module of the runtime allowed to read ambient time or make random
ids; a structural test walks the AST of everything else.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class SystemIdFactory:
    def new_id(self) -> uuid.UUID:
        return uuid.uuid4()


CLOCK = SystemClock()
IDS = SystemIdFactory()


def new_uuid() -> uuid.UUID:
    """Model default for primary keys."""
    return IDS.new_id()


def utcnow() -> datetime:
    """Model default for timestamps."""
    return CLOCK.now()
