"""The JSON text the store sends as a parameter (PostgreSQL parses it into
`jsonb`; SQLite keeps the text).

Encoded with orjson, which does the same job as `json.dumps` several times
faster: a step sends a dozen JSON parameters, and stdlib encoding was the
largest single item of a step's Python. The text only has to parse to the
same value, not to match `json.dumps` byte for byte (no hash is taken over
it: hashes use `runs.domain.context.canonical_json`). Whatever orjson does
not encode as `json.dumps(..., default=str)` would — integers beyond 64
bits, lone surrogates, keys that are not strings, nesting deeper than 254 —
goes to `json.dumps` instead, so the stored value is the same either way.
Datetimes and dataclasses are passed to `default=str`, as `json.dumps` does.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def compact(value: Any) -> str:
    """`value` as compact JSON text (non-ASCII kept as is; anything JSON has
    no type for as its `str`)."""
    try:
        return orjson.dumps(value, default=str, option=_OPTIONS).decode()
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def parsed(value: Any) -> Any:
    """A JSON column's value as read by hand: text (jsonb through Django's
    connection, which loads it as text; SQLite's JSON) is parsed, anything
    already parsed is returned as it is."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def compact_or_null(value: Any) -> str | None:
    """`compact`, with None kept as SQL NULL (a column left unset, not JSON `null`)."""
    return None if value is None else compact(value)
