"""A server's `tools/list` entry pinned into an agent version.

When a version naming `mcp__<server>__<tool>` is published, the server's
entry for `<tool>` — name, description, input schema, annotations — is
fetched and stored in the version's definition under `mcp_tools` (so the
version's hash, and every approval's request hash, covers it):

    "mcp_tools": {"mcp__git__git_status": {
        "server": "git", "tool": "git_status", "digest": "<sha256 of the entry>",
        "description": "...", "input_schema": {...}, "annotations": {"readOnlyHint": true, ...}}}

`digest` is the SHA-256 of the canonical JSON of the entry as the server
listed it; a call compares it with the entry the server lists right before
the call is sent, and fails `tool_changed` when they differ (or the tool is
gone). What the model and people are shown comes from the pin, never from a
later listing. A server's text is untrusted: the description is scrubbed of
secrets and cut to `MAX_DESCRIPTION` characters (the digest is over what the
server sent), the schema must be a JSON Schema of an object no larger than
`MAX_SCHEMA_BYTES`, and only the four hints and a title are kept of the
annotations — which stay hints: the configuration classifies the tool.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from runs.domain.scrub import scrub_text

MAX_DESCRIPTION = 4000
MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 32
HINTS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")
PINNED_KEYS = ("name", "description", "inputSchema", "annotations")


class PinFailed(ValueError):
    """A named MCP tool that cannot be pinned (its server, its listing, its schema); the message names it."""


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def entry_of(tool: Any) -> dict[str, Any]:
    """The pinned part of a listed tool (an SDK `Tool` or its JSON), as the server sent it."""
    raw = tool.model_dump(by_alias=True, mode="json", exclude_none=True) if hasattr(tool, "model_dump") else tool
    return {key: raw[key] for key in PINNED_KEYS if key in raw}


def digest(entry: dict[str, Any]) -> str:
    return hashlib.sha256(canonical(entry).encode()).hexdigest()


def _depth(value: Any, level: int = 0) -> int:
    if level > MAX_SCHEMA_DEPTH:
        return level
    if isinstance(value, dict):
        return max([_depth(v, level + 1) for v in value.values()] or [level])
    if isinstance(value, list):
        return max([_depth(v, level + 1) for v in value] or [level])
    return level


def _remote_ref(value: Any) -> bool:
    """Whether `value` holds a `$ref`/`$dynamicRef` outside the schema itself (anything but `#...`)."""
    if isinstance(value, dict):
        for key, sub in value.items():
            if key in ("$ref", "$dynamicRef") and not (isinstance(sub, str) and sub.startswith("#")):
                return True
            if _remote_ref(sub):
                return True
    elif isinstance(value, list):
        return any(_remote_ref(v) for v in value)
    return False


def schema_problem(schema: Any) -> str | None:
    """Why `schema` cannot be a pinned input schema, or None."""
    if not isinstance(schema, dict):
        return "the input schema is not a JSON object"
    if len(canonical(schema).encode()) > MAX_SCHEMA_BYTES:
        return f"the input schema is larger than {MAX_SCHEMA_BYTES // 1024} KiB"
    if _depth(schema) > MAX_SCHEMA_DEPTH:
        return f"the input schema nests deeper than {MAX_SCHEMA_DEPTH} levels"
    if schema.get("type") != "object":
        return 'the input schema is not {"type": "object", ...}'
    if _remote_ref(schema):
        return "the input schema refers outside itself ($ref other than #...): it is never fetched"
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return f"the input schema is not a valid JSON Schema ({scrub_text(exc.message)[:200]})"
    return None


def hints_of(annotations: Any) -> dict[str, Any]:
    """The server's hints (and title) as shown to people: booleans and a short title, nothing else."""
    if not isinstance(annotations, dict):
        return {}
    out: dict[str, Any] = {k: annotations[k] for k in HINTS if isinstance(annotations.get(k), bool)}
    title = annotations.get("title")
    if isinstance(title, str) and title:
        out["title"] = scrub_text(title)[:200]
    return out


def pin_of(server: str, tool: str, listed: Any) -> dict[str, Any]:
    """The pin of `listed` (the server's entry for `tool`); PinFailed when it cannot be pinned."""
    entry = entry_of(listed)
    problem = schema_problem(entry.get("inputSchema"))
    if problem is not None:
        raise PinFailed(problem)
    description = entry.get("description")
    return {
        "server": server,
        "tool": tool,
        "digest": digest(entry),
        "description": scrub_text(description)[:MAX_DESCRIPTION] if isinstance(description, str) else "",
        "input_schema": entry["inputSchema"],
        "annotations": hints_of(entry.get("annotations")),
    }


def valid_pin(pin: Any) -> bool:
    """The shape `pin_of` writes (a version's definition is read back from the database)."""
    return (
        isinstance(pin, dict)
        and isinstance(pin.get("server"), str)
        and isinstance(pin.get("tool"), str)
        and isinstance(pin.get("digest"), str)
        and isinstance(pin.get("description"), str)
        and isinstance(pin.get("input_schema"), dict)
        and isinstance(pin.get("annotations", {}), dict)
    )
