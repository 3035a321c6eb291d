"""The tracer the loop uses when no adapter is wired: spans cost nothing."""

from __future__ import annotations

from typing import Any


class _NullSpan:
    def set(self, key: str, value: Any) -> None:
        pass

    def __enter__(self) -> _NullSpan:
        return self

    def __exit__(self, *exc) -> None:
        return None


NULL_SPAN = _NullSpan()


class NullTracer:
    def span(self, name: str, attributes: dict[str, Any] | None = None, *, under: str | None = None) -> _NullSpan:
        return NULL_SPAN

    def begin_step(self, step_number: int, attributes: dict[str, Any] | None = None) -> None:
        pass

    def set_step(self, key: str, value: Any) -> None:
        pass

    def end_step(self) -> None:
        pass
