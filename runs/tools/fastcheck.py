"""A compiled accept-check for a raw tool's argument schema.

`jsonschema` decides: it gives the messages the model is shown, and its
verdict is the contract (JSON Schema 2020-12). It walks the schema anew for
every call, which made argument validation one of the largest items of a
step's Python before commit 1 (7 µs warm, ~18 µs in the loop). fastjsonschema
compiles a schema once into a plain Python function (well under a microsecond
for the built-in tools), but it implements draft-07 and older.

So the compiled function is used only to *accept*: when it passes, the
arguments are valid under 2020-12 too, because the schema is made only of
keywords whose meaning is the same in draft-07 and 2020-12 (`_SAME`, checked
recursively). `format` is left out, since fastjsonschema asserts formats and
jsonschema does not by default; so is a `pattern` with a `$`, which
fastjsonschema rewrites to an end-of-text anchor: stricter in general, but
not inside a negative lookahead such as `^a(?!$)`. When it rejects, or the
schema uses any other keyword, `jsonschema` runs as before. A schema is trusted code (tools
are registered in code, never by a tenant): compiling it generates Python.
tests/unit/test_tool_fastcheck.py checks the two verdicts agree on generated
schemas and arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import fastjsonschema

# Keywords that take a schema (or, for `properties`, a map of them).
_SUBSCHEMA = {"additionalProperties", "items", "not"}
_SUBSCHEMA_LISTS = {"allOf", "anyOf", "oneOf"}
_VALUES = {
    "type",
    "required",
    "enum",
    "const",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "pattern",
    # annotations: no assertion in either draft
    "title",
    "description",
    "default",
    "examples",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
}
_SAME = _SUBSCHEMA | _SUBSCHEMA_LISTS | _VALUES | {"properties"}
_DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"


def _portable(schema: Any) -> bool:
    """Whether `schema` means the same under draft-07 and 2020-12."""
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict) or not set(schema) <= _SAME:
        return False
    if isinstance(schema.get("exclusiveMinimum"), bool) or isinstance(schema.get("exclusiveMaximum"), bool):
        return False  # draft-04's boolean form
    if "$" in str(schema.get("pattern", "")):
        return False  # fastjsonschema matches `$` as `\Z` (see the module's docstring)
    if "items" in schema and not isinstance(schema["items"], dict | bool):
        return False  # the array form is `prefixItems` in 2020-12
    properties = schema.get("properties", {})
    if not isinstance(properties, dict) or not all(_portable(s) for s in properties.values()):
        return False
    if not all(_portable(schema[k]) for k in _SUBSCHEMA if k in schema):
        return False
    lists = [schema[k] for k in _SUBSCHEMA_LISTS if k in schema]
    return all(isinstance(items, list) and all(_portable(s) for s in items) for items in lists)


def compile_accept(schema: dict[str, Any]) -> Callable[[Any], bool] | None:
    """A function that returns True only for arguments valid under `schema`
    (False: "ask jsonschema"), or None when the schema is not portable."""
    body = {k: v for k, v in schema.items() if k != "$schema"}
    if schema.get("$schema", _DRAFT_2020_12) != _DRAFT_2020_12 or not _portable(body):
        return None
    try:
        check = fastjsonschema.compile(body, use_default=False, use_formats=False, detailed_exceptions=False)
    except Exception:  # anything it cannot compile is left to jsonschema
        return None

    def accept(arguments: Any) -> bool:
        try:
            check(arguments)
        except Exception:  # JsonSchemaValueException, or anything unexpected: jsonschema decides
            return False
        return True

    return accept
