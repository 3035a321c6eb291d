"""The store's JSON parameters (runs/store/json_text.py): orjson's text
parses to what `json.dumps(..., default=str)` gave, and what orjson does not
encode goes to `json.dumps`."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from enum import StrEnum

import pytest

from runs.store.json_text import compact


class Colour(StrEnum):
    RED = "red"


@dataclass
class Point:
    x: int


def stdlib(value):
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


VALUES = [
    None,
    {"a": 1, "b": [1.5, -0.0, 1e300, 2**63 - 1, True, None], "c": {"d": 'ünï \u2028 \u0001 "q" \\ /'}},
    [{"id": str(uuid.UUID(int=7)), "usage": {"cost_usd": 0.1 + 0.2}}],
    {"when": datetime(2026, 11, 30, 19, 43, 55, 101243, tzinfo=UTC)},  # default=str, as json.dumps does
    {"uuid": uuid.UUID(int=9), "decimal": Decimal("1.10"), "colour": Colour.RED, "set": {1}},
    {"point": Point(3)},  # a dataclass is its str, as json.dumps gives it
    {"big": 2**70, "negative_big": -(2**65)},  # beyond 64 bits: json.dumps
    {1: "int key", None: "null key"},  # keys that are not strings: json.dumps
    {"lone": "\ud800"},  # a lone surrogate: json.dumps
    {"nested": [[[{"x": [1]}]]]},
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_the_text_parses_to_what_json_dumps_gave(value):
    text = compact(value)
    assert isinstance(text, str)
    assert json.loads(text) == json.loads(stdlib(value))


def test_deeper_than_orjson_goes_to_json_dumps():
    value: list = []
    for _ in range(300):  # orjson stops at 254 levels
        value = [value]
    assert json.loads(compact(value)) == json.loads(stdlib(value))


def test_the_usual_value_is_compact_and_keeps_non_ascii():
    assert compact({"a": [1, "é"]}) == '{"a":[1,"é"]}'
