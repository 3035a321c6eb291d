"""Bound and scrub what a tool or a model returns before it is persisted."""
from __future__ import annotations

import json
import re
from typing import Any

MAX_RESULT_BYTES = 64 * 1024
MAX_DEPTH = 32

SECRET_PATTERNS = [
    re.compile(r"sk-[A-Za-z0-9_\-]{16,}"),
    re.compile(r"AKIA[0-9A-Z]{16}"),
    re.compile(r"gh[pousr]_[A-Za-z0-9]{30,}"),
    re.compile(r"xox[bpas]-[A-Za-z0-9\-]{10,}"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(-----END [A-Z ]*PRIVATE KEY-----|$)"),
    re.compile(r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),
]
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")


def scrub_text(text: str) -> str:
    text = text.replace("\x00", "\ufffd")
    text = _LONE_SURROGATE.sub("\ufffd", text)
    for pattern in SECRET_PATTERNS:
        text = pattern.sub("[REDACTED]", text)
    return text


def scrub(value: Any, depth: int = 0) -> Any:
    """Replace NUL and lone surrogates, redact secrets, cap nesting."""
    if depth > MAX_DEPTH:
        return "[TRUNCATED: too deeply nested]"
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, dict):
        return {scrub_text(str(k)): scrub(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(v, depth + 1) for v in value]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    return value


def bound(value: Any) -> tuple[Any, bool]:
    """Scrub, then cap the serialised size; return (value, truncated)."""
    value = scrub(value)
    text = json.dumps(value, ensure_ascii=False)
    if len(text.encode()) <= MAX_RESULT_BYTES:
        return value, False
    return {"truncated": True, "preview": text[: MAX_RESULT_BYTES // 2]}, True
