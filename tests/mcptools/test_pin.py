"""What a pin keeps of a server's listing, and what it refuses (issue 36 item 2): a server's text is untrusted."""

from __future__ import annotations

import pytest

from runs.tools.mcp.pin import MAX_DESCRIPTION, PinFailed, digest, entry_of, pin_of

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def listed(**extra):
    return {"name": "write", "description": "Write.", "inputSchema": SCHEMA, **extra}


def test_the_digest_covers_name_description_schema_and_annotations_as_listed():
    base = digest(entry_of(listed()))
    assert digest(entry_of(listed(description="Write!"))) != base
    assert digest(entry_of(listed(inputSchema={**SCHEMA, "properties": {}}))) != base
    assert digest(entry_of(listed(annotations={"readOnlyHint": True}))) != base
    assert digest(entry_of(listed(outputSchema={"type": "object"}))) == base  # not part of the pin


def test_a_pin_keeps_hints_only_and_scrubs_and_bounds_the_description():
    pin = pin_of(
        "fx",
        "write",
        listed(
            description="key sk-live-abcdefghijklmnopqrstuvwxyz0123456789 " + "x" * 10000,
            annotations={"readOnlyHint": True, "destructiveHint": "no", "title": "<b>t</b>", "evil": {"x": 1}},
        ),
    )
    assert pin["annotations"] == {"readOnlyHint": True, "title": "<b>t</b>"}
    assert len(pin["description"]) == MAX_DESCRIPTION and "sk-live-abcdefghij" not in pin["description"]


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"type": "array"}, 'not {"type": "object"'),
        ([], "not a JSON object"),
        ({"type": "object", "properties": {"a": {"type": "no-such-type"}}}, "not a valid JSON Schema"),
        ({"type": "object", "properties": {"a": {"$ref": "https://evil.example/s.json"}}}, "refers outside itself"),
        ({"type": "object", "description": "x" * 70000}, "larger than 64 KiB"),
    ],
)
def test_a_schema_that_cannot_be_pinned_is_refused(schema, says):
    with pytest.raises(PinFailed, match=says):
        pin_of("fx", "write", listed(inputSchema=schema))


def test_a_local_ref_is_fine():
    schema = {"type": "object", "$defs": {"n": {"type": "string"}}, "properties": {"name": {"$ref": "#/$defs/n"}}}
    assert pin_of("fx", "write", listed(inputSchema=schema))["input_schema"] == schema
