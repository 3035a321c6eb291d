"""The API's only parser: strict JSON (RELIABILITY §5, §6 B1–B5, B11, B17).

DRF's JSONParser reads the stream itself, so Django's
DATA_UPLOAD_MAX_MEMORY_SIZE never applies to it, and it lets a deep document
raise RecursionError (a 500). This parser bounds the size (413), the
nesting depth and the number of values (400), refuses NaN/Infinity and
numbers that overflow to infinity, duplicate keys, and NUL characters or
lone surrogates in any key or string, naming the field.
"""

from __future__ import annotations

import json
import math
import re

from django.conf import settings
from rest_framework import exceptions
from rest_framework.parsers import BaseParser

from runs.api.errors import DepthExceeded, PayloadTooLarge, TooLarge

MAX_DEPTH = 32
MAX_VALUES = 50_000
MAX_FIELD_ERRORS = 20
_SURROGATE = re.compile("[\ud800-\udfff]")


class _Duplicate(ValueError):
    pass


def _no_constants(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _pairs(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set = set()
        for key, _ in pairs:
            if key in seen:
                raise _Duplicate(f"duplicate key {key!r}")
            seen.add(key)
    return out


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "NUL characters are not allowed"
    if _SURROGATE.search(text):
        return "invalid Unicode (lone surrogate)"
    return None


def _name(path: tuple) -> str:
    if not path:
        return "(root)"
    return ".".join(str(p) for p in path).encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\u0000")


def check_document(data) -> None:
    """Walk a parsed document: depth, size, strings and numbers (iteratively)."""
    errors: dict[str, list[str]] = {}
    count = 0
    stack = [(data, (), 1)]
    while stack:
        value, path, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise TooLarge(f"the JSON body holds more than {MAX_VALUES} values")
        if isinstance(value, dict):
            if depth > MAX_DEPTH:
                raise DepthExceeded(f"the JSON body nests deeper than {MAX_DEPTH} levels")
            for key, item in value.items():
                problem = _text_problem(key)
                if problem:
                    errors.setdefault(_name((*path, key)), []).append(f"key: {problem}")
                stack.append((item, (*path, key), depth + 1))
        elif isinstance(value, list):
            if depth > MAX_DEPTH:
                raise DepthExceeded(f"the JSON body nests deeper than {MAX_DEPTH} levels")
            for index, item in enumerate(value):
                stack.append((item, (*path, index), depth + 1))
        elif isinstance(value, str):
            problem = _text_problem(value)
            if problem:
                errors.setdefault(_name(path), []).append(problem)
        elif isinstance(value, float) and not math.isfinite(value):
            errors.setdefault(_name(path), []).append("must be a finite number")
        if len(errors) >= MAX_FIELD_ERRORS:
            break
    if errors:
        raise exceptions.ValidationError(errors)


class StrictJSONParser(BaseParser):
    """application/json, UTF-8, bounded, strict."""

    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None):
        parser_context = parser_context or {}
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        request = parser_context.get("request")
        charset = (parser_context.get("encoding") or "utf-8").lower().replace("_", "-")
        if charset not in ("utf-8", "utf8"):
            raise exceptions.UnsupportedMediaType(media_type, detail="JSON bodies must be UTF-8")
        if request is not None and limit is not None:
            try:
                declared = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                declared = 0
            if declared > limit:
                raise PayloadTooLarge(f"the request body is larger than {limit} bytes")
        raw = stream.read(limit + 1) if limit is not None else stream.read()
        if limit is not None and len(raw) > limit:
            raise PayloadTooLarge(f"the request body is larger than {limit} bytes")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise exceptions.ParseError("the body is not valid UTF-8") from None
        try:
            data = json.loads(text, parse_constant=_no_constants, object_pairs_hook=_pairs)
        except RecursionError:
            raise DepthExceeded(f"the JSON body nests deeper than {MAX_DEPTH} levels") from None
        except _Duplicate as exc:
            raise exceptions.ParseError(f"JSON parse error: {exc}") from None
        except ValueError as exc:
            detail = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            position = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
            raise exceptions.ParseError(f"JSON parse error: {detail}{position}") from None
        check_document(data)
        return data
