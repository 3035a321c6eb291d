"""Product code states its invariants instead of pointing elsewhere for them.

A comment, docstring or string of the product's packages that says "DESIGN §n", "seed 002", "issue 33" or
"session 12" sends a newcomer to a document the repository does not ship, or to a tracker that will move on;
the code says what holds instead (the user documentation is docs/). This gate scans every source file of the
apps in INSTALLED_APPS that are ours, of the project package and of the templates, and ships with a planted
module it must catch line by line."""

from __future__ import annotations

import re
from pathlib import Path

from tests.gates.structure import ROOT

POINTER = re.compile(r"\bDESIGN\s*(?:§|\.md)|\b[Ss]eed \d{3}\b|\b[Ii]ssue \d+\b|\b[Ss]ession \d+\b")
PRODUCT = ("agentrt_site", "runs", "approvals", "checkpoints", "maintenance", "ops", "webhooks", "templates")
SUFFIXES = {".py", ".html", ".js", ".css", ".txt"}
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "planted_pointers.py"


def pointers(paths) -> list[tuple[str, int, str]]:
    found = []
    for path in paths:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if POINTER.search(line):
                found.append((str(path.relative_to(ROOT)), n, line.strip()))
    return found


def product_files() -> list[Path]:
    return [
        p
        for package in PRODUCT
        for p in sorted((ROOT / package).rglob("*"))
        if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts
    ]


def test_product_code_names_no_design_section_seed_issue_or_session():
    files = product_files()
    assert len(files) > 200 and ROOT / "runs/runtime/executor.py" in files  # the whole product, not a corner

    found = pointers(files)

    assert found == [], "state the rule instead of pointing at a document:\n" + "\n".join(
        f"{path}:{n}: {line}" for path, n, line in found
    )


def test_the_pointer_gate_catches_each_planted_line_and_nothing_else():
    planted = {n for n, line in enumerate(FIXTURE.read_text().splitlines(), start=1) if line.endswith("# planted")}

    assert {n for _, n, _ in pointers([FIXTURE])} == planted and len(planted) == 5
