"""The event vocabulary gate (issue 12 item 1): every event type written or
queried by name is an `EventType` member, and docs/events.md lists every member.
Each check runs over the code and must find nothing, and over its planted
fixture and must find exactly the planted lines."""

from __future__ import annotations

from pathlib import Path

from runs.domain.events import EventType, page_vocabulary
from tests.gates.structure import ROOT
from tests.gates.vocabulary import (
    documentation_violations,
    documented_event_types,
    event_type_violations,
    scanned_files,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "vocab"  # beside test_structure.py's own fixtures


def test_every_event_type_written_or_queried_is_an_enum_member():
    violations = event_type_violations(scanned_files())
    assert not violations, "\n".join(str(v) for v in violations)


def test_the_gate_catches_each_planted_event_type():
    fixture = FIXTURES / "planted_event_types.py"
    lines = fixture.read_text(encoding="utf-8").splitlines()
    planted = {n for n, line in enumerate(lines, start=1) if line.rstrip().endswith("# planted")}
    found = {v.line for v in event_type_violations([fixture], root=ROOT)}
    assert found == planted


def test_every_member_is_documented_in_the_event_types_page():
    readme = (ROOT / "docs" / "events.md").read_text(encoding="utf-8")
    assert documentation_violations(readme) == []


def test_the_documentation_check_catches_a_missing_and_an_unknown_name():
    listed = sorted(t.value for t in EventType if t is not EventType.APPROVAL_INVALIDATED)
    readme = "# agentrt\n\n## Event types\n\n" + ", ".join(f"`{n}`" for n in listed) + ", `run.exploded`.\n\n## Next\n"
    assert documented_event_types(readme) == set(listed) | {"run.exploded"}
    assert documentation_violations(readme) == [
        "approval.invalidated: an EventType member docs/events.md does not list",
        "run.exploded: listed in docs/events.md but not an EventType member",
    ]


def test_the_pages_get_every_type_by_member_name():
    vocabulary = page_vocabulary()
    assert vocabulary["types"] == {t.name: t.value for t in EventType}
    assert set(vocabulary["classes"]) <= set(vocabulary["types"].values())
    assert set(vocabulary["status_after"]) <= set(vocabulary["types"].values())
