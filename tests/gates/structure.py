"""Structural gates (seed 002's hard gates) as pure functions over source files.

Each gate takes a list of file paths (and the project root they are relative
to) and returns the violations it finds, by walking the AST; nothing is
imported or executed. `tests/gates/test_structure.py` runs every gate over
the runtime code, and over a planted fixture that each gate must catch.
"""

from __future__ import annotations

import ast
import builtins
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.gates.apps import APPS

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_PACKAGES = APPS  # every app of INSTALLED_APPS (tests/gates/apps.py)
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
# Random or time-based id generators: the stdlib's (3.14 adds uuid6/7/8) and the uuid6 package's (runs.clock's uuid7).
AMBIENT_IDENTITY = frozenset(
    {"uuid.uuid4", "uuid.uuid1", "uuid.uuid6", "uuid.uuid7", "uuid.uuid8", "uuid6.uuid6", "uuid6.uuid7", "uuid6.uuid8"}
)
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
    """No `uuid.uuid4` / `uuid.uuid1` / `uuid6.uuid7` (or kin: AMBIENT_IDENTITY),
    called or referenced, outside the IdFactory adapter, however imported."""
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
    if qualified == "time.sleep" or qualified.startswith(("urllib.request.", "requests.", "httpx.", "httpcore.")):
        return qualified
    if qualified in ("webhooks.delivery.deliver", "webhooks.outbound.post", "webhooks.tasks.deliver"):
        return f"{qualified} (a hook or webhook delivery)"
    if isinstance(func, ast.Name) and (func.id == "urlopen" or qualified.endswith(".urlopen")):
        return func.id
    if not isinstance(func, ast.Attribute):
        return None
    receiver = _chain_identifiers(func.value)
    last = receiver[0] if receiver else ""
    attr = func.attr
    if attr == "complete":
        return f"{last}.complete (a model call)"
    if attr == "post" and last == "outbound":
        return "outbound.post (a webhook send)"
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


def _helpers(tree: ast.Module) -> dict[str, ast.AST]:
    """The module's own functions a call can name: `name` for a module-level
    function, `Class.name` for a method (called as `self.name(...)` or
    `cls.name(...)` inside that class)."""
    found: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found[f"{node.name}.{item.name}"] = item
    return found


def _helper_called(call: ast.Call, helpers: dict[str, ast.AST], cls: str | None) -> tuple[str, ast.AST] | None:
    func = call.func
    if isinstance(func, ast.Name) and func.id in helpers:
        return func.id, helpers[func.id]
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in ("self", "cls"):
        key = f"{cls}.{func.attr}" if cls else None
        if key in helpers:
            return f"{func.value.id}.{func.attr}", helpers[key]
    return None


def _io_calls_in(function: ast.AST, aliases: dict[str, str]) -> list[tuple[int, str]]:
    """The I/O calls in a function's own body (nested functions and lambdas
    included: they may run when called)."""
    out = []
    for stmt in getattr(function, "body", []):
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call):
                what = _io_call(node, aliases)
                if what:
                    out.append((node.lineno, what))
    return out


def _enclosing_classes(tree: ast.Module) -> dict[int, str]:
    """Node id → the name of the class whose method holds it."""
    owner: dict[int, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for inner in ast.walk(node):
                owner[id(inner)] = node.name
    return owner


def transaction_io_violations(paths: Iterable[Path], root: Path = ROOT) -> list[Violation]:
    """Inside `with transaction.atomic(...)` (or an `@transaction.atomic`
    function): no model `.complete(`, no `tools.execute(`, no `urlopen` /
    `_OPENER.open`, no `sleep`, no `.wait(`, no hook or webhook delivery
    (`webhooks.delivery.deliver`, `outbound.post`) — neither directly nor in a
    function of the same module called there (one level: `helper(...)`,
    `self.helper(...)`), reported at the call inside the transaction."""
    found = []
    for path in paths:
        relpath = rel(path, root)
        tree = _parse(path)
        aliases = _aliases(tree, relpath)
        helpers = _helpers(tree)
        classes = _enclosing_classes(tree)
        seen: set[int] = set()
        for start, body in _atomic_bodies(tree, aliases):
            for stmt in body:
                for node in ast.walk(stmt):
                    if not isinstance(node, ast.Call) or id(node) in seen:
                        continue
                    what = _io_call(node, aliases)
                    if what is None:
                        called = _helper_called(node, helpers, classes.get(id(node)))
                        if called is not None:
                            inner = _io_calls_in(called[1], aliases)
                            if inner:
                                line, io = inner[0]
                                what = f"{called[0]}() (which calls {io} at line {line})"
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
# Who may write a run's status and lease columns, keyed `path::function`
# (`Class.method` for a method, `<module>` for module level): a write from any
# other function — even another function of a listed module — is a violation.
WRITERS: dict[str, frozenset[str]] = {
    # finalize decides the transition (a typed `Transition`) ...
    "runs/runtime/finalize.py::_transition": frozenset({"status", "lease_owner", "lease_expires_at"}),
    # ... and the store's one statement for it carries it out.
    "runs/store/fence.py::transition_fence": frozenset({"status", "lease_owner", "lease_expires_at"}),
    # claim, heartbeat, take-over: the lease's own statements.
    "runs/store/lease.py::_claim_queued_sql": frozenset({"status", *LEASE_COLUMNS}),
    "runs/store/lease.py::_claim_next_sql": frozenset({"status", *LEASE_COLUMNS}),
    "runs/store/lease.py::renew": frozenset({"lease_expires_at"}),
    "runs/store/lease.py::_take_over_sql": frozenset(LEASE_COLUMNS),
    # A retry (issue 38 item 5): a FAILED run leased again, then ended through finalize like a take-over.
    "runs/store/lease.py::_reopen_sql": frozenset({"status", *LEASE_COLUMNS}),
    # Runs that hold no lease: cancel of a queued / waiting run (run_cancel's, and the children of a
    # parent that ends while they run), a waiting run failed,
    # WAITING_FOR_APPROVAL → QUEUED after the last decision, WAITING_FOR_USER → QUEUED on input.
    "runs/runtime/children.py::run_end_leaseless": frozenset({"status"}),
    "runs/services/lifecycle.py::fail_waiting": frozenset({"status"}),
    # The join (seed 002, M6), in the transaction that ends a child: the parent waiting for its
    # children back to QUEUED when the last one ends, or FAILED when their usage puts it over budget.
    "runs/runtime/children.py::_requeue": frozenset({"status"}),
    "runs/runtime/children.py::_fail_parent": frozenset({"status"}),
    "approvals/services.py::_requeue": frozenset({"status"}),
    "runs/services/inputs.py::run_input": frozenset({"status"}),
}
RUN_MODEL_NAMES = frozenset({"Run", "runs"})
# The typed transition finalize passes to the store (runs/store/fence.py).
TRANSITION_TYPES = frozenset({"Transition"})
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
UNANALYSABLE = "?"

_UPDATE = re.compile(
    r"\bUPDATE\s+(?:ONLY\s+)?(\"?[\w.]+\"?(?:\.\"?\w+\"?)?)\s+(?:AS\s+\w+\s+|\w+\s+)?SET\b", re.IGNORECASE
)
_SET = re.compile(r"\bSET\b", re.IGNORECASE)
_END = re.compile(r"\b(WHERE|RETURNING|FROM)\b|;", re.IGNORECASE)
_ASSIGN = re.compile(r"(?:\"?(\w+)\"?\.)?\"?\b(" + "|".join(GUARDED_COLUMNS) + r")\b\"?\s*=(?!=)", re.IGNORECASE)
HOLE = "{}"


@dataclass(frozen=True)
class Write:
    path: str
    line: int
    column: str  # a guarded column, or UNANALYSABLE
    how: str  # sql | orm | attribute | typed | unanalysable: why
    function: str = "<module>"  # the enclosing def, dotted through classes and defs

    @property
    def where(self) -> str:
        return f"{self.path}::{self.function}"


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


def _has_target_hole(clause: str) -> bool:
    """Whether a formatted hole stands where a SET list names a column: an
    item of the top-level list with a hole left of its `=`, or with no `=`
    at all (`SET {sets}`). A hole right of `=` is a value: the column is
    still known."""
    for item in clause.split(","):
        target, eq, _ = item.partition("=")
        if HOLE in target or (not eq and HOLE in item):
            return True
    return False


def _clause_end(text: str, start: int) -> int:
    end = _END.search(text, start)
    return end.start() if end else len(text)


def sql_writes(text: str) -> tuple[list[str], list[str], bool, bool]:
    """Analyse one SQL string (formatted holes rendered as `{}`).

    Return (columns it writes on `runs`, the tables its UPDATE statements
    name, whether it is a bare fragment, whether a `runs` SET list has a
    hole where a column is named — unanalysable). Only the SET part counts:
    the `status = 'RUNNING'` of a fenced UPDATE's WHERE is a guard. UPDATEs
    of other tables (approvals, tool_invocations, model_calls) write nothing
    here. A string with no `UPDATE <table>` (a SET list built apart) is a
    fragment: it counts as a write of what it assigns at its top level,
    before any WHERE."""
    blanked = _blank(text)
    updates = list(_UPDATE.finditer(blanked))
    if updates:
        columns, tables, unanalysable = [], [], False
        for match in updates:
            table = match.group(1).replace('"', "").split(".")[-1].lower()
            tables.append(table)
            if table == "runs":
                clause = blanked[match.end() : _clause_end(blanked, match.end())]
                columns += _set_assignments(clause)
                unanalysable = unanalysable or _has_target_hole(clause)
        return columns, tables, False, unanalysable
    set_keyword = _SET.search(blanked)
    begin = set_keyword.end() if set_keyword else 0
    return _set_assignments(blanked[begin : _clause_end(blanked, begin)]), [], True, False


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*\d*(?:\.\d+)?[sdifr]")
_FORMAT_FIELD = re.compile(r"\{[^{}]*\}")


class _StringCollector(ast.NodeVisitor):
    """Every string expression of a module (constants; f-strings, `%`
    formatting and `.format` with their holes as `{}`; `+` concatenations,
    a non-string operand being a hole), skipping docstrings, with the
    function node that holds it and that function's dotted name."""

    def __init__(self):
        self.strings: list[tuple[str, int, ast.AST | None, str]] = []
        self.scope: list[ast.AST | None] = [None]
        self.names: list[str] = []

    def _name(self) -> str:
        return ".".join(self.names) or "<module>"

    def _add(self, text: str, line: int) -> None:
        self.strings.append((text, line, self.scope[-1], self._name()))

    def _function(self, node):
        self.scope.append(node)
        self.names.append(node.name)
        self.generic_visit(node)
        self.names.pop()
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_Lambda(self, node):
        self.scope.append(node)
        self.generic_visit(node)
        self.scope.pop()

    def visit_ClassDef(self, node):
        self.names.append(node.name)
        self.generic_visit(node)
        self.names.pop()

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
            return "".join(v.value if isinstance(v, ast.Constant) else HOLE for v in node.values)
        return HOLE

    def visit_BinOp(self, node):
        if isinstance(node.op, ast.Mod) and self._is_str(node.left):  # "... %s ..." % values
            self._add(_PERCENT_SPEC.sub(HOLE, self._render(node.left)).replace("%%", "%"), node.lineno)
            if isinstance(node.left, ast.JoinedStr):
                self._holes(node.left)
            self.visit(node.right)
            return
        leaves = self._leaves(node) if isinstance(node.op, ast.Add) else []
        if not any(self._is_str(leaf) for leaf in leaves):
            self.generic_visit(node)
            return
        self._add("".join(self._render(leaf) for leaf in leaves), node.lineno)
        for leaf in leaves:
            if isinstance(leaf, ast.JoinedStr):
                self._holes(leaf)
            elif not self._is_str(leaf):
                self.visit(leaf)

    def visit_Call(self, node):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "format" and self._is_str(func.value):
            template = self._render(func.value).replace("{{", "\0").replace("}}", "\1")
            self._add(_FORMAT_FIELD.sub(HOLE, template).replace("\0", "{").replace("\1", "}"), node.lineno)
            if isinstance(func.value, ast.JoinedStr):
                self._holes(func.value)
            for arg in [*node.args, *node.keywords]:
                self.visit(arg)
            return
        self.generic_visit(node)

    def _holes(self, node: ast.JoinedStr):
        for v in node.values:
            if isinstance(v, ast.FormattedValue):
                self.visit(v.value)

    def visit_JoinedStr(self, node):
        self._add(self._render(node), node.lineno)
        self._holes(node)

    def visit_Constant(self, node):
        if isinstance(node.value, str):
            self._add(node.value, node.lineno)


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
        self.names: list[str] = []
        self.run_querysets: list[set[str]] = [set()]

    def _write(self, line: int, column: str, how: str) -> None:
        self.writes.append(Write(self.relpath, line, column, how, ".".join(self.names) or "<module>"))

    def visit_ClassDef(self, node):
        self.classes.append(node.name)
        self.names.append(node.name)
        self.generic_visit(node)
        self.names.pop()
        self.classes.pop()

    def _function(self, node):
        self.run_querysets.append(set())
        self.names.append(node.name)
        self.generic_visit(node)
        self.names.pop()
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
                self._write(line, target.attr, "attribute")

    def _is_transition(self, func: ast.AST) -> bool:
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name in TRANSITION_TYPES:
            return True
        qualified = _qualified(func, self.aliases) or ""
        return qualified.rpartition(".")[2] in TRANSITION_TYPES

    def visit_Call(self, node):
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr in ("update", "bulk_update", "update_or_create")
            and self._mentions_run(func.value)
        ):
            for column in self._orm_columns(node):
                if column == UNANALYSABLE:
                    self._write(node.lineno, column, f"unanalysable: {func.attr}() with columns not named in the code")
                else:
                    self._write(node.lineno, column, "orm")
        if self._is_transition(func):
            for column in self._transition_columns(node):
                how = "typed" if column != UNANALYSABLE else "unanalysable: Transition(**…)"
                self._write(node.lineno, column, how)
        if isinstance(func, ast.Name) and func.id == "setattr" and len(node.args) >= 2:
            obj, attr = node.args[0], node.args[1]
            if isinstance(attr, ast.Constant) and attr.value in GUARDED_COLUMNS:
                if attr.value in LEASE_COLUMNS or _names_a_run(_chain_identifiers(obj), self.classes):
                    self._write(node.lineno, attr.value, "attribute")
        self.generic_visit(node)

    @staticmethod
    def _transition_columns(call: ast.Call) -> list[str]:
        """`Transition(status=…, release_lease=…)` writes the status and, unless
        `release_lease` is the constant False, releases the lease."""
        keywords = {kw.arg: kw.value for kw in call.keywords}
        if None in keywords:
            return [UNANALYSABLE]
        columns = ["status"] if "status" in keywords or call.args else []
        release = keywords.get("release_lease", call.args[1] if len(call.args) > 1 else None)
        if not (isinstance(release, ast.Constant) and release.value is False):
            columns += ["lease_owner", "lease_expires_at"]
        return columns

    def _orm_columns(self, call: ast.Call) -> list[str]:
        columns = []
        for kw in call.keywords:
            if kw.arg in GUARDED_COLUMNS:
                columns.append(kw.arg)
            elif kw.arg is None:  # update(**{...}): only a literal dict with constant keys is read
                if isinstance(kw.value, ast.Dict) and all(
                    isinstance(k, ast.Constant) and isinstance(k.value, str) for k in kw.value.keys
                ):
                    columns += [k.value for k in kw.value.keys if k.value in GUARDED_COLUMNS]
                else:
                    columns.append(UNANALYSABLE)
            elif kw.arg in ("defaults", "fields"):
                columns += _constant_keys(kw.value)
        if call.func.attr == "bulk_update" and len(call.args) >= 2:
            columns += _constant_keys(call.args[1])
        return columns


def _constant_keys(node: ast.AST) -> list[str]:
    """The guarded columns a literal dict's keys or a literal list names;
    UNANALYSABLE for anything else (a variable, a comprehension, a key that
    is not a constant)."""
    if isinstance(node, ast.Dict):
        items = node.keys
    elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = node.elts
    else:
        return [UNANALYSABLE]
    if not all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in items):
        return [UNANALYSABLE]
    return [k.value for k in items if k.value in GUARDED_COLUMNS]


def terminal_writes(paths: Iterable[Path], root: Path = ROOT) -> list[Write]:
    """Every write of a run's status or lease columns found in the files:
    SQL (UPDATE runs SET … and bare SET fragments), ORM updates on `Run`
    querysets, attribute assignments and typed `Transition`s — and every
    write the gate cannot read (column UNANALYSABLE): an `update(**fields)`
    on runs, a formatted hole where a runs SET list names a column."""
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
        for text, line, scope, function in collector.strings:
            columns, tables, fragment, unanalysable = sql_writes(text)
            tables_by_scope.setdefault(id(scope), set()).update(tables)
            analysed.append((columns, fragment, unanalysable, line, scope, function))
        for columns, fragment, unanalysable, line, scope, function in analysed:
            if fragment and columns:
                tables = tables_by_scope.get(id(scope), set())
                if tables and "runs" not in tables:
                    continue
            writes += [Write(relpath, line, column, "sql", function) for column in columns]
            if unanalysable:
                writes.append(
                    Write(relpath, line, UNANALYSABLE, "unanalysable: a formatted hole in a runs SET list", function)
                )
        finder = _WriteFinder(relpath, _aliases(tree, relpath))
        finder.visit(tree)
        writes += finder.writes
    return writes


def terminal_writer_violations(
    paths: Iterable[Path], root: Path = ROOT, writers: dict[str, frozenset[str]] = WRITERS
) -> list[Violation]:
    """Status and lease columns of `runs` are written only by the functions
    of the writer table (DESIGN §4), and every write of `runs` can be read."""
    found = []
    for write in terminal_writes(paths, root):
        if write.column == UNANALYSABLE:
            found.append(
                Violation(
                    "terminal-writer",
                    write.path,
                    write.line,
                    f"{write.how} in {write.function}: the gate cannot tell which columns of runs it writes",
                )
            )
        elif write.column not in writers.get(write.where, frozenset()):
            found.append(
                Violation(
                    "terminal-writer",
                    write.path,
                    write.line,
                    f"writes runs.{write.column} ({write.how}) in {write.function};"
                    " only the writer table of DESIGN §4 may",
                )
            )
    return found


# -- gate: errors live in their errors.py ---------------------------------------------

ERROR_HOMES = frozenset({"runs/domain/errors.py", "runs/errors.py"})
# Exception classes of runs/ defined elsewhere, each with why it stays.
ERROR_EXCEPTIONS: dict[str, str] = {
    "runs/api/errors.py::PayloadTooLarge": "REST-layer (DRF APIException) errors have their own errors.py",
    "runs/api/errors.py::DepthExceeded": "REST-layer (DRF APIException)",
    "runs/api/errors.py::TooLarge": "REST-layer (DRF APIException)",
    "runs/api/errors.py::Unavailable": "REST-layer (DRF APIException)",
    "runs/providers/endpoints.py::EndpointConfigError": "a settings error raised at startup, never to a caller",
    "runs/runtime/faults.py::FaultInjected": "the fault-injection hook's own signal (tests and chaos only)",
    "runs/store/repository.py::_Fenced": "private control flow: rolls back the transaction, becomes WorkerFenced",
    "runs/runtime/resume.py::_Fenced": "private control flow of the resume path, becomes a fenced outcome",
    "runs/providers/wire/retry.py::Retry": "control flow of the providers' shared retry loop, never leaves it",
    "runs/providers/registry.py::DuplicateProvider": "a configuration error raised at startup (two providers)",
    "runs/tools/registry.py::DuplicateTool": "a configuration error raised at startup (two tools, one name)",
    "runs/tools/mcp/config.py::McpConfigError": "a settings error raised at startup (AGENTRT_MCP_SERVERS)",
    "runs/tools/mcp/pin.py::PinFailed": "becomes InvalidInput naming `tools` when a version is published",
    "runs/tools/mcp/client.py::Unavailable": "an MCP server not reached: becomes a failed tool result (nothing sent)",
    "runs/management/commands/demo.py::_Stop": "private control flow of the demo supervisor",
    "runs/management/commands/demo.py::_WebDown": "private control flow of the demo supervisor (web not started)",
    "runs/api/parsers.py::_Duplicate": "private control flow of the JSON parser (duplicate keys)",
    "runs/domain/loop.py::_ModelFailure": "private control flow of the loop",
    # Domain errors still beside the code that raises them (runs/domain is being reshaped in the same issue).
    "runs/domain/context_engine.py::ContextOverflow": "domain; to move to runs/domain/errors.py",
    "runs/domain/context_engine.py::SynthesisReserveViolation": "domain; to move to runs/domain/errors.py",
    "runs/domain/pipeline/batch.py::UnknownOutcome": "domain; to move to runs/domain/errors.py",
    "runs/domain/pipeline/batch.py::RerunConflict": "domain; to move to runs/domain/errors.py",
}
_BUILTIN_EXCEPTIONS = frozenset(
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
)


def _base_names(node: ast.ClassDef) -> list[str]:
    names = []
    for base in node.bases:
        dotted = _dotted(base)
        if dotted:
            names.append(dotted.rpartition(".")[2])
    return names


def exception_classes(paths: Iterable[Path], root: Path = ROOT) -> list[tuple[str, int, str]]:
    """(path, line, class) for every class that derives — directly or through
    classes of the given files, matched by name — from an exception: a
    builtin one, or any base named `…Error` / `…Exception` (a library's)."""
    classes = []
    for path in paths:
        relpath = rel(path, root)
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.ClassDef):
                classes.append((relpath, node.lineno, node.name, _base_names(node)))
    exceptions = set(_BUILTIN_EXCEPTIONS)
    changed = True
    while changed:
        changed = False
        for _, _, name, bases in classes:
            if name not in exceptions and any(b in exceptions or b.endswith(("Error", "Exception")) for b in bases):
                exceptions.add(name)
                changed = True
    return [(relpath, line, name) for relpath, line, name, bases in classes if name in exceptions and bases]


def error_home_violations(
    paths: Iterable[Path], root: Path = ROOT, exempt: dict[str, str] = ERROR_EXCEPTIONS
) -> list[Violation]:
    """Exception classes of runs/ are defined in runs/domain/errors.py (the
    core's) or runs/errors.py (the application's), unless listed with a
    reason in ERROR_EXCEPTIONS."""
    return [
        Violation("error-homes", relpath, line, f"exception {name} is defined outside {sorted(ERROR_HOMES)}")
        for relpath, line, name in exception_classes(paths, root)
        if relpath not in ERROR_HOMES and f"{relpath}::{name}" not in exempt
    ]
