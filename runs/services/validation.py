"""Checks every service applies to what a caller hands it: text fields and pydantic errors named by field."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from runs.errors import InvalidInput
from runs.providers import PROVIDERS


def pydantic_fields(exc: ValidationError, prefix: str = "") -> dict[str, list[str]]:
    fields: dict[str, list[str]] = {}
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"] if not (isinstance(p, str) and p in PROVIDERS.union_tags()))
        fields.setdefault(prefix + (loc or "(root)"), []).append(err["msg"])
    return fields


def check_text(value: Any, field: str, *, max_length: int = 100_000, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"{field} must be a string", fields={field: ["must be a string"]})
    if not allow_empty and not value.strip():
        raise InvalidInput(f"{field} must not be empty", fields={field: ["must not be empty"]})
    if len(value) > max_length:
        raise InvalidInput(f"{field} is too long", fields={field: [f"at most {max_length} characters"]})
    if "\x00" in value:
        raise InvalidInput(f"{field} contains a NUL character", fields={field: ["NUL characters are not allowed"]})
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(
            f"{field} contains a lone surrogate", fields={field: ["invalid Unicode (lone surrogate)"]}
        ) from None
    return value
