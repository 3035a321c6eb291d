"""Structural gates (seed 002's hard gates) as pure functions over source files.

Each gate takes a list of file paths (and the project root they are relative
to) and returns the violations it finds, by walking the AST; nothing is
imported or executed. `tests/gates/test_structure.py` runs every gate over
the runtime code, and over a planted fixture that each gate must catch.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_PACKAGES = ("runs", "approvals", "checkpoints", "maintenance")
EXCLUDED_DIRS = {"migrations", "__pycache__"}


@dataclass(frozen=True)
class Violation:
    gate: str
    path: str  # relative to the root, posix
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: [{self.gate}] {self.message}"


# -- files ----------------------------------------------------------------------


def runtime_files(root: Path = ROOT) -> list[Path]:
    """Every .py of the runtime packages except migrations (management
    commands are runtime code and are included)."""
    files = []
    for package in RUNTIME_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if EXCLUDED_DIRS.isdisjoint(path.relative_to(root).parts):
                files.append(path)
    return files


def rel(path: Path, root: Path = ROOT) -> str:
    path = Path(path).resolve()
    try:
        return path.relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def _parse(path: Path) -> ast.Module:
    return ast.parse(Path(path).read_text(encoding="utf-8"), filename=str(path))


def _module_name(relpath: str) -> str:
    parts = relpath[:-3].split("/") if relpath.endswith(".py") else relpath.split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _package_name(relpath: str) -> str:
    module = _module_name(relpath)
    if relpath.endswith("__init__.py"):
        return module
    return module.rpartition(".")[0]


def _resolve_relative(relpath: str, level: int, module: str | None) -> str:
    """`from ..x import y` in `relpath` → the absolute module it names."""
    package = _package_name(relpath).split(".") if _package_name(relpath) else []
    base = package[: len(package) - (level - 1)] if level > 1 else package
    if level - 1 > len(package):
        base = []
    return ".".join([*base, module] if module else base)


def _aliases(tree: ast.Module, relpath: str) -> dict[str, str]:
    """Names bound by imports anywhere in the module → the qualified name they
    stand for (`import time as t` → t: time; `from uuid import uuid4` →
    uuid4: uuid.uuid4)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    names[a.asname] = a.name
                else:
                    top = a.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom):
            module = _resolve_relative(relpath, node.level, node.module) if node.level else (node.module or "")
            for a in node.names:
                if a.name != "*":
                    names[a.asname or a.name] = f"{module}.{a.name}" if module else a.name
    return names


def _dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a chain of attributes on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _qualified(node: ast.AST, aliases: dict[str, str]) -> str | None:
    dotted = _dotted(node)
    if dotted is None:
        return None
    head, _, rest = dotted.partition(".")
    head = aliases.get(head, head)
    return f"{head}.{rest}" if rest else head


def _chain_identifiers(node: ast.AST) -> list[str]:
    """Every name and attribute along a call chain: `Run.objects.filter(x).update`
    → [update, filter, objects, Run] (arguments are not followed)."""
    out = []
    while True:
        if isinstance(node, ast.Attribute):
            out.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Name):
            out.append(node.id)
            return out
        else:
            return out


# -- gate: ambient time and identity ----------------------------------------------

AMBIENT_TIME = frozenset(
    {
        "datetime.datetime.now",
        "datetime.datetime.utcnow",
        "datetime.datetime.today",
        "datetime.date.today",
        "time.time",
        "time.time_ns",
        "time.monotonic",
        "time.monotonic_ns",
        "time.perf_counter",
        "time.perf_counter_ns",
        "django.utils.timezone.now",
    }
)
AMBIENT_IDENTITY = frozenset({"uuid.uuid4", "uuid.uuid1"})
CLOCK_ADAPTER = frozenset({"runs/clock.py"})


def _banned_references(
    paths: Iterable[Path], banned: frozenset[str], gate: str, exempt: frozenset[str], root: Path
) -> list[Violation]:
    found = []
    # `from time import *` binds time.time; `from django.utils.timezone import *` binds now.
    star_modules = {name.rsplit(".", 1)[0] for name in banned} | {
        name.split(".")[0] for name in banned if not name.startswith("django.")
    }
    for path in paths:
        relpath = rel(path, root)
        if relpath in exempt:
            continue
        tree = _parse(path)
        aliases = _aliases(tree, relpath)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = _resolve_relative(relpath, node.level, node.module) if node.level else (node.module or "")
                for a in node.names:
                    if a.name == "*" and module in star_modules:
                        found.append(
                            Violation(
                                gate,
                                relpath,
                                node.lineno,
                                f"`from {module} import *` can bind {module}'s clock/id functions",
                            )
                        )
                    elif f"{module}.{a.name}" in banned:
                        found.append(Violation(gate, relpath, node.lineno, f"imports {module}.{a.name}"))
            elif isinstance(node, (ast.Attribute, ast.Name)) and isinstance(getattr(node, "ctx", None), ast.Load):
                name = _qualified(node, aliases)
                if name in banned:
                    # ast.walk also visits the inner nodes of a chain (`time` in
                    # `time.time`); only the whole chain can match exactly.
                    found.append(
                        Violation(gate, relpath, node.lineno, f"references {name}; use the Clock/IdFactory port")
                    )
    return found


def ambient_time_violations(
    paths: Iterable[Path], root: Path = ROOT, exempt: frozenset[str] = CLOCK_ADAPTER
) -> list[Violation]:
    """No `datetime.now`, `time.time`, `time.monotonic`, `timezone.now` (or
    kin) outside the Clock adapter, however imported."""
    return _banned_references(paths, AMBIENT_TIME, "ambient-time", exempt, root)


def ambient_identity_violations(
    paths: Iterable[Path], root: Path = ROOT, exempt: frozenset[str] = CLOCK_ADAPTER
) -> list[Violation]:
    """No `uuid.uuid4` / `uuid.uuid1` (called or referenced) outside the
    IdFactory adapter, however imported."""
    return _banned_references(paths, AMBIENT_IDENTITY, "ambient-identity", exempt, root)


# -- gate: the domain package imports no framework ---------------------------------

DOMAIN_PACKAGE = "runs.domain"
DOMAIN_THIRD_PARTY = frozenset({"pydantic"})


def domain_files(paths: Iterable[Path], root: Path = ROOT) -> list[Path]:
    return [p for p in paths if rel(p, root).startswith("runs/domain/")]


def _domain_allowed(module: str) -> bool:
    top = module.split(".")[0]
    if module == DOMAIN_PACKAGE or module.startswith(DOMAIN_PACKAGE + "."):
        return True
    if top == "runs":  # runs.models, runs.store.repository, …: the adapters, never the core
        return False
    return top in sys.stdlib_module_names or top in DOMAIN_THIRD_PARTY


def domain_import_violations(paths: Iterable[Path], root: Path = ROOT) -> list[Violation]:
    """Every file given is checked as domain code: it may import the standard
    library, pydantic and `runs.domain` itself — nothing from Django or from
    the rest of the project (relative imports are resolved first)."""
    found = []
    for path in paths:
        relpath = rel(path, root)
        tree = _parse(path)
        for node in ast.walk(tree):
            modules: list[str] = []
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = _resolve_relative(relpath, node.level, node.module)
                    if node.module is None:  # `from .. import models`: each name is a module
                        modules = [f"{base}.{a.name}" if base else a.name for a in node.names]
                    else:
                        modules = [base]
                else:
                    modules = [node.module or ""]
            elif isinstance(node, ast.Call):
                func = _dotted(node.func) or ""
                if func.split(".")[-1] in ("import_module", "__import__") and node.args:
                    arg = node.args[0]
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        modules = [arg.value]
            for module in modules:
                if not _domain_allowed(module):
                    found.append(
                        Violation("domain-imports", relpath, node.lineno, f"the domain core imports {module!r}")
                    )
    return found


# -- gate: no transaction across external I/O ------------------------------------

ATOMIC = frozenset({"django.db.transaction.atomic", "transaction.atomic", "atomic"})


def _is_atomic(node: ast.AST, aliases: dict[str, str]) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    name = _qualified(target, aliases)
    return name in ATOMIC or (name or "").endswith("transaction.atomic")


def _io_call(call: ast.Call, aliases: dict[str, str]) -> str | None:
    """Name the external I/O a call makes, or None."""
    func = call.func
    qualified = _qualified(func, aliases) or ""
    if qualified == "time.sleep" or qualified.startswith(("urllib.request.", "requests.", "httpx.")):
        return qualified
    if isinstance(func, ast.Name) and (func.id == "urlopen" or qualified.endswith(".urlopen")):
        return func.id
    if not isinstance(func, ast.Attribute):
        return None
    receiver = _chain_identifiers(func.value)
    last = receiver[0] if receiver else ""
    attr = func.attr
    if attr == "complete":
        return f"{last}.complete (a model call)"
    if attr == "execute" and last in ("tools", "REGISTRY", "registry"):
        return f"{last}.execute (a tool call)"
    if attr == "urlopen":
        return f"{last}.urlopen"
    if attr == "open" and "opener" in last.lower():
        return f"{last}.open"
    if attr == "sleep":
        return f"{last}.sleep"
    if attr == "wait":
        return f"{last}.wait"
    return None


def _atomic_bodies(tree: ast.Module, aliases: dict[str, str]) -> Iterator[tuple[int, list[ast.AST]]]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.With, ast.AsyncWith)):
            if any(_is_atomic(item.context_expr, aliases) for item in node.items):
                yield node.lineno, node.body
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if any(_is_atomic(d, aliases) for d in node.decorator_list):
                yield node.lineno, node.body


def atomic_blocks(paths: Iterable[Path], root: Path = ROOT) -> list[tuple[str, int]]:
    """Where `transaction.atomic` blocks open (to show the gate is not vacuous)."""
    out = []
    for path in paths:
        tree = _parse(path)
        out += [(rel(path, root), line) for line, _ in _atomic_bodies(tree, _aliases(tree, rel(path, root)))]
    return out


def transaction_io_violations(paths: Iterable[Path], root: Path = ROOT) -> list[Violation]:
    """Inside `with transaction.atomic(...)` (or an `@transaction.atomic`
    function): no model `.complete(`, no `tools.execute(`, no `urlopen` /
    `_OPENER.open`, no `sleep`, no `.wait(`."""
    found = []
    for path in paths:
        relpath = rel(path, root)
        tree = _parse(path)
        aliases = _aliases(tree, relpath)
        seen: set[int] = set()
        for start, body in _atomic_bodies(tree, aliases):
            for stmt in body:
                for node in ast.walk(stmt):
                    if isinstance(node, ast.Call) and id(node) not in seen:
                        what = _io_call(node, aliases)
                        if what:
                            seen.add(id(node))
                            found.append(
                                Violation(
                                    "transaction-io",
                                    relpath,
                                    node.lineno,
                                    f"{what} inside the transaction opened at line {start}",
                                )
                            )
    return found


# -- gate: one terminal writer ---------------------------------------------------

LEASE_COLUMNS = ("lease_owner", "lease_epoch", "lease_expires_at")
GUARDED_COLUMNS = ("status", *LEASE_COLUMNS)
WRITERS: dict[str, frozenset[str]] = {
    "runs/runtime/executor.py": frozenset({"status", "lease_owner", "lease_expires_at"}),  # finalize
    "runs/runtime/queue.py": frozenset(
        {"status", "lease_owner", "lease_epoch", "lease_expires_at"}
    ),  # claim, heartbeat
    "runs/runtime/resume.py": frozenset({"lease_owner", "lease_epoch", "lease_expires_at"}),  # take_over
    "runs/services/lifecycle.py": frozenset({"status"}),  # cancel of queued / waiting runs
    "approvals/services.py": frozenset({"status"}),  # WAITING_* → QUEUED
    "runs/services/inputs.py": frozenset({"status"}),  # WAITING_FOR_USER → QUEUED (the input service)
}
RUN_MODEL_NAMES = frozenset({"Run", "runs"})
# Receivers whose `.status` is another table's column, not the run's.
OTHER_ENTITIES = (
    "approval",
    "invocation",
    "model_call",
    "call",
    "checkpoint",
    "event",
    "session",
    "tenant",
    "agent",
    "heartbeat",
    "beat",
    "response",
    "resp",
)

_UPDATE = re.compile(
    r"\bUPDATE\s+(?:ONLY\s+)?(\"?[\w.]+\"?(?:\.\"?\w+\"?)?)\s+(?:AS\s+\w+\s+|\w+\s+)?SET\b", re.IGNORECASE
)
_SET = re.compile(r"\bSET\b", re.IGNORECASE)
_END = re.compile(r"\b(WHERE|RETURNING|FROM)\b|;", re.IGNORECASE)
_ASSIGN = re.compile(r"(?:\"?(\w+)\"?\.)?\"?\b(" + "|".join(GUARDED_COLUMNS) + r")\b\"?\s*=(?!=)", re.IGNORECASE)


@dataclass(frozen=True)
class Write:
    path: str
    line: int
    column: str
    how: str  # sql | orm | attribute


def _blank(text: str) -> str:
    """Blank out SQL string literals ('...') and anything inside parentheses,
    keeping offsets, so only the statement's top level is left to match.
    Double quotes are identifiers in SQL and stay."""
    out = []
    depth = 0
    in_literal = False
    for ch in text:
        if in_literal:
            out.append("'" if ch == "'" else " ")
            in_literal = ch != "'"
            continue
        if ch == "'" and depth == 0:
            in_literal = True
            out.append(ch)
        elif ch == "(":
            depth += 1
            out.append("(" if depth == 1 else " ")
        elif ch == ")":
            depth = max(0, depth - 1)
            out.append(")" if depth == 0 else " ")
        else:
            out.append(" " if depth else ch)
    return "".join(out)


def _set_assignments(clause: str) -> list[str]:
    """Guarded columns assigned at the top level of a SET list: an assignment
    starts the clause or follows a comma or SET; one after AND/OR/WHEN is a
    guard, not a write."""
    columns = []
    for match in _ASSIGN.finditer(clause):
        qualifier = match.group(1)
        if qualifier and qualifier.lower() != "runs":
            continue
        before = clause[: match.start()].rstrip()
        if before == "" or before.endswith(",") or re.search(r"\bSET$", before, re.IGNORECASE):
            columns.append(match.group(2).lower())
    return columns


def _clause_end(text: str, start: int) -> int:
    end = _END.search(text, start)
    return end.start() if end else len(text)


def sql_writes(text: str) -> tuple[list[str], list[str], bool]:
    """Analyse one SQL string (f-string holes rendered as `{}`).

    Return (columns it writes on `runs`, the tables its UPDATE statements
    name, whether it is a bare fragment). Only the SET part counts: the
    `status = 'RUNNING'` of a fenced UPDATE's WHERE is a guard. UPDATEs of
    other tables (approvals, tool_invocations, model_calls) write nothing
    here. A string with no `UPDATE <table>` (a SET list built apart, like
    finalize's `transition_sql`) is a fragment: it counts as a write of what
    it assigns at its top level, before any WHERE."""
    blanked = _blank(text)
    updates = list(_UPDATE.finditer(blanked))
    if updates:
        columns, tables = [], []
        for match in updates:
            table = match.group(1).replace('"', "").split(".")[-1].lower()
            tables.append(table)
            if table == "runs":
                columns += _set_assignments(blanked[match.end() : _clause_end(blanked, match.end())])
        return columns, tables, False
    set_keyword = _SET.search(blanked)
    begin = set_keyword.end() if set_keyword else 0
    return _set_assignments(blanked[begin : _clause_end(blanked, begin)]), [], True


class _StringCollector(ast.NodeVisitor):
    """Every string expression of a module (constants, f-strings with holes as
    `{}`, `+` concatenations), skipping docstrings, with the function that
    holds it."""

    def __init__(self):
        self.strings: list[tuple[str, int, ast.AST | None]] = []
        self.scope: list[ast.AST | None] = [None]

    def _function(self, node):
        self.scope.append(node)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Expr(self, node):
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return  # a docstring or a bare string statement
        self.generic_visit(node)

    @staticmethod
    def _is_str(node) -> bool:
        return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))

    def _leaves(self, node) -> list:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self._leaves(node.left) + self._leaves(node.right)
        return [node]

    def _render(self, node) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        return "{}"

    def visit_BinOp(self, node):
        leaves = self._leaves(node) if isinstance(node.op, ast.Add) else []
        if not any(self._is_str(leaf) for leaf in leaves):
            self.generic_visit(node)
            return
        self.strings.append(("".join(self._render(leaf) for leaf in leaves), node.lineno, self.scope[-1]))
        for leaf in leaves:
            if isinstance(leaf, ast.JoinedStr):
                self._holes(leaf)
            elif not self._is_str(leaf):
                self.visit(leaf)

    def _holes(self, node: ast.JoinedStr):
        for v in node.values:
            if isinstance(v, ast.FormattedValue):
                self.visit(v.value)

    def visit_JoinedStr(self, node):
        self.strings.append((self._render(node), node.lineno, self.scope[-1]))
        self._holes(node)

    def visit_Constant(self, node):
        if isinstance(node.value, str):
            self.strings.append((node.value, node.lineno, self.scope[-1]))


def _names_a_run(receiver: list[str], classes: list[str]) -> bool:
    """Whether an object whose `.status` is assigned may be a run: `self` in a
    class not named for runs is that class's own field; a receiver named for
    another table (approval, invocation, …) is that table's; anything else
    might be a run and counts."""
    if not receiver:
        return True
    name = receiver[0]
    if receiver == ["self"]:
        return bool(classes) and "run" in classes[-1].lower()
    low = name.lower()
    if "run" in low:
        return True
    return not any(entity in low for entity in OTHER_ENTITIES)


class _WriteFinder(ast.NodeVisitor):
    def __init__(self, relpath: str, aliases: dict[str, str]):
        self.relpath = relpath
        self.aliases = aliases
        self.writes: list[Write] = []
        self.classes: list[str] = []
        self.run_querysets: list[set[str]] = [set()]

    def visit_ClassDef(self, node):
        self.classes.append(node.name)
        self.generic_visit(node)
        self.classes.pop()

    def _function(self, node):
        self.run_querysets.append(set())
        self.generic_visit(node)
        self.run_querysets.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def _mentions_run(self, node) -> bool:
        for name in _chain_identifiers(node):
            if name in RUN_MODEL_NAMES or name in self.run_querysets[-1]:
                return True
            if self.aliases.get(name, "").endswith(".Run"):
                return True
        return False

    # `qs = Run.objects.filter(...)` then `qs.update(status=...)`
    def visit_Assign(self, node):
        for target in node.targets:
            self._assignment_target(target, node.lineno)
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and self._mentions_run(node.value):
            self.run_querysets[-1].add(node.targets[0].id)
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        self._assignment_target(node.target, node.lineno)
        self.generic_visit(node)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self._assignment_target(node.target, node.lineno)
        self.generic_visit(node)

    def _assignment_target(self, target, line):
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._assignment_target(element, line)
        elif isinstance(target, ast.Starred):
            self._assignment_target(target.value, line)
        elif isinstance(target, ast.Attribute) and target.attr in GUARDED_COLUMNS:
            if target.attr in LEASE_COLUMNS or _names_a_run(_chain_identifiers(target.value), self.classes):
                self.writes.append(Write(self.relpath, line, target.attr, "attribute"))

    def visit_Call(self, node):
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr in ("update", "bulk_update", "update_or_create")
            and self._mentions_run(func.value)
        ):
            for column in self._orm_columns(node):
                self.writes.append(Write(self.relpath, node.lineno, column, "orm"))
        if isinstance(func, ast.Name) and func.id == "setattr" and len(node.args) >= 2:
            obj, attr = node.args[0], node.args[1]
            if isinstance(attr, ast.Constant) and attr.value in GUARDED_COLUMNS:
                if attr.value in LEASE_COLUMNS or _names_a_run(_chain_identifiers(obj), self.classes):
                    self.writes.append(Write(self.relpath, node.lineno, attr.value, "attribute"))
        self.generic_visit(node)

    def _orm_columns(self, call: ast.Call) -> list[str]:
        columns = []
        for kw in call.keywords:
            if kw.arg in GUARDED_COLUMNS:
                columns.append(kw.arg)
            elif kw.arg is None and isinstance(kw.value, ast.Dict):  # update(**{"status": ...})
                columns += [
                    k.value for k in kw.value.keys if isinstance(k, ast.Constant) and k.value in GUARDED_COLUMNS
                ]
            elif kw.arg in ("defaults", "fields"):
                columns += _constant_keys(kw.value)
        if call.func.attr == "bulk_update" and len(call.args) >= 2:
            columns += _constant_keys(call.args[1])
        return columns


def _constant_keys(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Dict):
        items = node.keys
    elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = node.elts
    else:
        return []
    return [k.value for k in items if isinstance(k, ast.Constant) and k.value in GUARDED_COLUMNS]


def terminal_writes(paths: Iterable[Path], root: Path = ROOT) -> list[Write]:
    """Every write of a run's status or lease columns found in the files:
    SQL (UPDATE runs SET … and bare SET fragments), ORM updates on `Run`
    querysets, and attribute assignments."""
    writes: list[Write] = []
    for path in paths:
        relpath = rel(path, root)
        tree = _parse(path)
        collector = _StringCollector()
        collector.visit(tree)
        # The tables each function UPDATEs: a bare fragment in a function that
        # only UPDATEs other tables belongs to those tables.
        tables_by_scope: dict[int, set[str]] = {}
        analysed = []
        for text, line, scope in collector.strings:
            columns, tables, fragment = sql_writes(text)
            tables_by_scope.setdefault(id(scope), set()).update(tables)
            analysed.append((columns, fragment, line, scope))
        for columns, fragment, line, scope in analysed:
            if fragment and columns:
                tables = tables_by_scope.get(id(scope), set())
                if tables and "runs" not in tables:
                    continue
            writes += [Write(relpath, line, column, "sql") for column in columns]
        finder = _WriteFinder(relpath, _aliases(tree, relpath))
        finder.visit(tree)
        writes += finder.writes
    return writes


def terminal_writer_violations(
    paths: Iterable[Path], root: Path = ROOT, writers: dict[str, frozenset[str]] = WRITERS
) -> list[Violation]:
    """Status and lease columns of `runs` are written only by the writer
    table of DESIGN §4."""
    found = []
    for write in terminal_writes(paths, root):
        if write.column not in writers.get(write.path, frozenset()):
            found.append(
                Violation(
                    "terminal-writer",
                    write.path,
                    write.line,
                    f"writes runs.{write.column} ({write.how}); only the writer table of DESIGN §4 may",
                )
            )
    return found
