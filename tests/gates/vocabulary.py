"""The event-vocabulary gate (issue 12 item 1), as pure functions over source
files: every event type the code writes or queries by name is an
`EventType` member, and every member is documented in docs/events.md's "Event
types" list. Nothing is imported from the scanned files; they are parsed."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from runs.domain.events import EventType
from tests.gates.apps import APPS
from tests.gates.structure import ROOT, Violation, rel

SCANNED_PACKAGES = APPS  # every app of INSTALLED_APPS (tests/gates/apps.py)
EXCLUDED_DIRS = {"migrations", "__pycache__"}
MEMBERS = {t.value for t in EventType}
EVENT_QUERIES = {"filter", "exclude", "get", "create"}  # Event.objects.<query>(type=...)


def scanned_files(root: Path = ROOT) -> list[Path]:
    files = []
    for package in SCANNED_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if EXCLUDED_DIRS.isdisjoint(path.relative_to(root).parts):
                files.append(path)
    return files


def _names(node: ast.AST) -> list[str]:
    """Identifiers along a call's receiver chain (`Event.objects.filter` → Event, objects, filter)."""
    out = []
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        if isinstance(node, ast.Attribute):
            out.append(node.attr)
            node = node.value
        else:
            node = node.func if isinstance(node, ast.Call) else node.value
    if isinstance(node, ast.Name):
        out.append(node.id)
    return out[::-1]


def _type_expressions(call: ast.Call) -> Iterator[ast.AST]:
    """The expressions naming the event type(s) of a write or an events query."""
    func = call.func
    callee = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if callee == "EventWrite" or (callee == "event" and isinstance(func, ast.Attribute)):
        if call.args:
            yield call.args[0]
        for kw in call.keywords:
            if kw.arg in ("type", "type_"):
                yield kw.value
    elif callee in EVENT_QUERIES and "Event" in _names(func):
        for kw in call.keywords:
            if kw.arg == "type":
                yield kw.value
            elif kw.arg == "type__in" and isinstance(kw.value, ast.Tuple | ast.List | ast.Set):
                yield from kw.value.elts


def _literal_problems(node: ast.AST) -> Iterator[tuple[int, str]]:
    """A string literal that is not a member's value, or `EventType.X` with no member X."""
    if isinstance(node, ast.IfExp):
        yield from _literal_problems(node.body)
        yield from _literal_problems(node.orelse)
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        if node.value not in MEMBERS:
            yield node.lineno, f"event type {node.value!r} is not an EventType member (runs/domain/events.py)"
    elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("EventType", "E"):
        if node.attr not in EventType.__members__:
            yield node.lineno, f"EventType has no member {node.attr}"


def event_type_violations(paths: Iterable[Path], root: Path = ROOT) -> list[Violation]:
    found = []
    for path in paths:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            for expr in _type_expressions(node):
                for line, message in _literal_problems(expr):
                    found.append(Violation("event-types", rel(path, root), line, message))
    return sorted(found, key=lambda v: (v.path, v.line))


def documented_event_types(readme: str) -> set[str]:
    """The backticked names in docs/events.md's "Event types" section (up to the next heading)."""
    match = re.search(r"^#+ Event types\s*$(.*?)(?=^#)", readme + "\n#", re.M | re.S)
    if match is None:
        return set()
    return set(re.findall(r"`([a-z_]+(?:\.[a-z_]+)+)`", match.group(1)))


def documentation_violations(readme: str) -> list[str]:
    """Members docs/events.md does not list, and listed names that are not members."""
    listed = documented_event_types(readme)
    missing = sorted(MEMBERS - listed)
    unknown = sorted(listed - MEMBERS)
    return [f"{name}: an EventType member docs/events.md does not list" for name in missing] + [
        f"{name}: listed in docs/events.md but not an EventType member" for name in unknown
    ]
