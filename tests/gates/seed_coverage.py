"""The seed-coverage gate (issue 15): docs/seed-coverage.md's "Seed 002 coverage"
table against seed 002's milestone table and the repository, as pure
functions over text and source files (nothing is imported or run).

- every capability line of the seed's table has a row that names a test,
  rows follow the seed's order and carry its milestone;
- every path named in backticks exists, and every name in parentheses after a
  Python module (`path.py` (`name`, `Class.method`)) is defined in it;
- every test named as a pytest node id (`tests/...py::test_x`) is a test
  function the file defines (an AST walk);
- every `mutant name` is a file of tests/mutants/;
- a row that names no test says "not built".
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tests.gates.structure import ROOT

SECTION = "## Seed 002 coverage"
COLUMNS = ("milestone", "seed line", "ours", "module", "test")
BEYOND = "—"  # a row beyond the seed's table: its milestone and seed line cells
NOT_BUILT = "not built"

# Seed 002 (002_49fcda87ac0bf8ad.txt: the name carries the document's hash, so
# it does not change under us), "Milestones": the capability table, word for
# word, in its order. The seed is not part of the repository (a clone has no
# copy), so this list is the reference; it was compared with the seed's text
# by `seed_milestones` when written (2026-11-30), and `seed_milestones` has its
# own test on a synthetic table.
SEED_MILESTONES: tuple[tuple[str, str], ...] = (
    ("Step, run_loop, RunExecutor, finalize", "M1"),
    ("Clock, IdFactory", "M1"),
    ("BudgetLedger, STEP and ATTEMPT scopes", "M1"),
    ("select_final_message, EmptyModelTurn", "M1"),
    ("CancellationToken, points 1-3", "M1"),
    ("RunQueue claim, lease, heartbeat", "M2"),
    ("supervisor task, fencing, run.fenced", "M2"),
    ("CheckpointRepository, delta chain", "M2"),
    ("seed_checkpoint, resume, run.resumed", "M2"),
    ("maintenance role and the four sweeps", "M2"),
    ("Suspension APPROVAL, pipeline.resume", "M4"),
    ("cancellation of a waiting run", "M4"),
    ("cancel endpoint, points 4-6, sandbox", "M5"),
    ("Suspension USER, ask_user, input", "M5"),
    ("Suspension CHILD_RUN, the join", "M6"),
    ("build_with_pressure, Compactor, cap 2", "M7"),
    ("apply_runtime_carry", "M7"),
)

_TICKED = re.compile(r"`([^`]+)`")
_PATH = re.compile(r"^[\w.-]+(?:/[\w.-]+)+/?$")
_NAMED = re.compile(r"`([^`]+)`\s*\(((?:\s*`[^`]+`\s*,?)+)\)")
_MUTANT = re.compile(r"mutant `([^`]+)`")
_SEED_ROW = re.compile(r"^(\S.*?) (M\d+)$")


@dataclass(frozen=True)
class Finding:
    line: int  # in the markdown; 0 for the table as a whole
    kind: str
    message: str

    def __str__(self) -> str:
        return f"docs/seed-coverage.md:{self.line}: [{self.kind}] {self.message}"


@dataclass(frozen=True)
class Row:
    line: int
    cells: tuple[str, ...]

    def cell(self, column: str) -> str:
        return self.cells[COLUMNS.index(column)]


# -- the seed ---------------------------------------------------------------------


def seed_milestones(text: str) -> list[tuple[str, str]]:
    """The capability table of the seed's "Milestones" section: (capability,
    milestone) pairs in the seed's order. ValueError when it is not there."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Milestones")), None)
    if start is None:
        raise ValueError("the seed has no 'Milestones' section")
    header = next((i for i in range(start, len(lines)) if lines[i].strip() == "# capability milestone"), None)
    if header is None:
        raise ValueError("the seed's 'Milestones' section has no '# capability milestone' table")
    pairs = []
    for line in lines[header + 1 :]:
        match = _SEED_ROW.match(line.strip())
        if match is None:
            break
        pairs.append((match.group(1), match.group(2)))
    if not pairs:
        raise ValueError("the seed's milestone table has no rows")
    return pairs


# -- the table --------------------------------------------------------------------


def table_rows(markdown: str) -> tuple[list[Row], list[Finding]]:
    """The rows of the section's table (after its header and separator)."""
    lines = markdown.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == SECTION), None)
    if start is None:
        return [], [Finding(0, "table", f"no '{SECTION}' section")]
    first = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("|")), None)
    if first is None or any(lines[i].startswith("## ") for i in range(start + 1, first)):
        return [], [Finding(start + 1, "table", f"no table under '{SECTION}'")]
    header = tuple(_cells(lines[first]))
    if header != COLUMNS:
        return [], [Finding(first + 1, "table", f"the columns are {list(header)}, not {list(COLUMNS)}")]
    rows, findings = [], []
    for i in range(first + 2, len(lines)):
        if not lines[i].startswith("|"):
            break
        cells = tuple(_cells(lines[i]))
        if len(cells) != len(COLUMNS):
            findings.append(Finding(i + 1, "row", f"{len(cells)} cells, not {len(COLUMNS)}"))
            continue
        rows.append(Row(i + 1, cells))
    return rows, findings


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


# -- the checks -------------------------------------------------------------------


def check(
    markdown: str, seed: tuple[tuple[str, str], ...] | list[tuple[str, str]] = SEED_MILESTONES, root: Path = ROOT
) -> list[Finding]:
    rows, findings = table_rows(markdown)
    if not rows and findings:
        return findings
    order = {capability: i for i, (capability, _) in enumerate(seed)}
    milestone = dict(seed)
    tested: set[str] = set()
    previous: str | None = None
    beyond_seen = False
    for row in rows:
        line = row.cell("seed line")
        if line == BEYOND:
            beyond_seen = True
            if row.cell("milestone") != BEYOND:
                findings.append(
                    Finding(
                        row.line,
                        "milestone",
                        f"a row beyond the seed's table has milestone {row.cell('milestone')}, not {BEYOND}",
                    )
                )
        elif line not in order:
            findings.append(Finding(row.line, "seed_line", f"{line!r} is not a line of the seed's milestone table"))
        else:
            if row.cell("milestone") != milestone[line]:
                findings.append(
                    Finding(
                        row.line, "milestone", f"{line!r} is {milestone[line]} in the seed, not {row.cell('milestone')}"
                    )
                )
            if beyond_seen:
                findings.append(Finding(row.line, "order", f"{line!r} comes after a row beyond the seed's table"))
            elif previous is not None and order[line] < order[previous]:
                findings.append(Finding(row.line, "order", f"{line!r} comes after {previous!r}, which follows it"))
            previous = line
        node_ids = [t for t in _TICKED.findall(row.cell("test")) if "::" in t]
        if node_ids:
            tested.add(line)
        elif NOT_BUILT not in row.cell("test"):
            findings.append(
                Finding(row.line, "no_test", f"names no test (pytest node id) and does not say {NOT_BUILT!r}")
            )
        findings.extend(_references(row, root))
    for capability, _ in seed:
        if capability not in tested:
            findings.append(Finding(0, "capability", f"{capability!r} has no row naming a test"))
    return findings


def _references(row: Row, root: Path) -> list[Finding]:
    findings = []
    text = " | ".join(row.cells)
    for token in _TICKED.findall(text):
        if "::" in token:
            problem = _node_id_problem(token, root)
            if problem is not None:
                findings.append(Finding(row.line, problem[0], problem[1]))
        elif _PATH.match(token) and not (root / token).exists():
            findings.append(Finding(row.line, "path", f"{token} does not exist"))
    for path, names in _NAMED.findall(text):
        target = root / path
        if not _PATH.match(path) or not target.is_file():
            continue  # not a module, or missing (reported above)
        if target.suffix != ".py":
            findings.append(Finding(row.line, "name", f"names in {path} cannot be checked (not Python)"))
            continue
        defined = _definitions(target)
        for name in _TICKED.findall(names):
            if not _defines(defined, name):
                findings.append(Finding(row.line, "name", f"{path} defines no {name}"))
    for name in _MUTANT.findall(text):
        if not (root / "tests" / "mutants" / f"{name}.toml").is_file():
            findings.append(Finding(row.line, "mutant", f"no tests/mutants/{name}.toml"))
    return findings


def _node_id_problem(node_id: str, root: Path) -> tuple[str, str] | None:
    path, *parts = node_id.split("::")
    target = root / path
    if not path.startswith("tests/") or not path.endswith(".py") or not target.is_file():
        return "test_file", f"{path} is not a test file of the repository"
    parts[-1] = parts[-1].split("[", 1)[0]  # a parametrized id names its function
    if not parts[-1].startswith("test") or len(parts) > 2:
        return "test", f"{node_id} does not name a test function"
    body = _parse(target).body
    if len(parts) == 2:
        cls = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == parts[0]), None)
        if cls is None:
            return "test", f"{path} defines no class {parts[0]}"
        body = cls.body
    if not any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == parts[-1] for n in body):
        return "test", f"{path} defines no test {parts[-1]}"
    return None


@cache  # the files do not change while the gate runs; each is parsed once
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


@cache
def _definitions(path: Path) -> dict[str, set[str]]:
    """Names a module defines: "" → every def, class and assigned name at any
    depth; a class name → the names its own body defines."""
    out: dict[str, set[str]] = {"": set()}
    for node in ast.walk(_parse(path)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out[""].add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out[""].update(t.id for t in targets if isinstance(t, ast.Name))
        if isinstance(node, ast.ClassDef):
            out.setdefault(node.name, set()).update(
                n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            )
            for n in node.body:
                if isinstance(n, ast.Assign | ast.AnnAssign):
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    out[node.name].update(t.id for t in targets if isinstance(t, ast.Name))
    return out


def _defines(defined: dict[str, set[str]], name: str) -> bool:
    if "." not in name:
        return name in defined[""]
    owner, member = name.split(".", 1)
    return "." not in member and member in defined.get(owner, set())
