"""Retry signals and HTTP helpers shared by the HTTP model providers."""

from __future__ import annotations

import email.utils
import math
from datetime import UTC
from typing import Any, TypedDict

import httpx
from django.conf import settings

from runs.clock import CLOCK

ERROR_BODY_LIMIT = 64 * 1024


def default_max_call_seconds() -> float:
    try:
        if settings.configured:
            return float(getattr(settings, "AGENTRT_MAX_CALL_SECONDS", 300))
    except Exception:  # pragma: no cover - settings unusable: fall back
        pass
    return 300.0


class RetryPolicy(TypedDict):
    max_tries: int
    backoff_base: float
    backoff_cap: float
    max_wait: float


def retry_policy() -> RetryPolicy:
    """The HTTP providers' retry of a failure before any output, from the
    settings (AGENTRT_MODEL_RETRY_*): the keyword arguments of
    `HTTPModelProvider` a provider's `build` passes."""
    return {
        "max_tries": int(getattr(settings, "AGENTRT_MODEL_RETRY_TRIES", 6)),
        "backoff_base": float(getattr(settings, "AGENTRT_MODEL_RETRY_BACKOFF_SECONDS", 0.5)),
        "backoff_cap": float(getattr(settings, "AGENTRT_MODEL_RETRY_BACKOFF_MAX_SECONDS", 8.0)),
        "max_wait": float(getattr(settings, "AGENTRT_MODEL_RETRY_MAX_WAIT_SECONDS", 30.0)),
    }


class Retry(Exception):
    """A failure before any output: the provider may try again."""

    def __init__(self, error_class: str, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.error_class = error_class
        self.message = message
        self.retry_after = retry_after


def retry_after(headers: httpx.Headers) -> float | None:
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(0.0, float(value) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        seconds = float(value)
        return max(0.0, seconds) if math.isfinite(seconds) else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - CLOCK.now()).total_seconds())


def read_limited(response: httpx.Response) -> bytes:
    data = bytearray()
    try:
        for piece in response.iter_bytes():
            data += piece
            if len(data) >= ERROR_BODY_LIMIT:
                break
    except (httpx.TransportError, httpx.StreamError):
        pass
    return bytes(data[:ERROR_BODY_LIMIT])


def count(value: Any) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(0, value)
    if isinstance(value, float) and math.isfinite(value):
        return max(0, int(value))
    return 0
