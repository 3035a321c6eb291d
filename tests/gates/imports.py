"""The import-graph gate (issue 12 item 3): no import cycle between the project's modules.

An AST walk (no code is imported) collects every import of every module under the apps — at the top of the
module and inside functions alike, since a function-local import is how a cycle hides — resolves each to the
project module it loads (`from a.b import c` is the module `a.b.c` when that is a module, else `a.b`), and
reports each strongly connected component of two or more modules. Loading `a.b.c` first runs the `__init__`
of `a` and of `a.b`: those are edges too (`from runs.services import scoping` runs the services facade, which
imports every service), except the packages the importing module itself lives in, which are already loading
when it runs (so a package's `__init__` may import its own submodules and they may import each other)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from tests.gates.apps import APPS, SITE

ROOT = Path(__file__).resolve().parents[2]
# Every app of INSTALLED_APPS, the project package and the benchmarks: no cycle anywhere among them.
PACKAGES = (*APPS, SITE, "bench")


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    local: bool  # inside a function

    def __str__(self) -> str:
        return f"{self.source}:{self.line} imports {self.target}{' (function-local)' if self.local else ''}"


def modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every module of `packages` under `root` but migrations."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def edges(known: dict[str, Path]) -> list[Edge]:
    out = []
    for source, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        local = {n.lineno for n in _local_nodes(tree)}
        package = source if path.name == "__init__.py" else source.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*parts, base] if base else parts)
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            else:
                continue
            targets = [t for t in (_resolve(name, known) for name in names) if t is not None]
            for target in dict.fromkeys(loaded for t in targets for loaded in _loads(t, source, known)):
                out.append(Edge(source, target, node.lineno, node.lineno in local))
    return out


def _loads(target: str, source: str, known: dict[str, Path]) -> list[str]:
    """The modules importing `target` from `source` runs: the packages on the way down (but those `source` is
    inside of, already loading) and `target` itself."""
    parts = target.split(".")
    chain = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    mine = source.split(".")
    mine = {".".join(mine[:i]) for i in range(1, len(mine) + 1)}
    return [m for m in chain if m in known and m not in mine and m != source]


def cycles(known: dict[str, Path]) -> list[list[Edge]]:
    """Each import cycle as the edges inside one strongly connected component (Tarjan's algorithm)."""
    graph: dict[str, list[Edge]] = {}
    for edge in edges(known):
        graph.setdefault(edge.source, []).append(edge)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for edge in graph.get(node, []):
            if edge.target not in index:
                visit(edge.target)
                low[node] = min(low[node], low[edge.target])
            elif edge.target in on_stack:
                low[node] = min(low[node], index[edge.target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(known):
        if node not in index:
            visit(node)
    return [
        sorted((e for m in sorted(c) for e in graph.get(m, []) if e.target in c), key=lambda e: (e.source, e.line))
        for c in components
    ]


def unexplained_local_imports(known: dict[str, Path]) -> list[str]:
    """Function-local imports with no reason written next to them: a comment on the import, or on the line
    above it (or above the run of imports it belongs to, its sections of imports separated by one blank line
    as the import sorter writes them). A local import is kept only for a reason (the app registry is not
    ready yet, settings imports the module, an optional SDK); habit moves to the top."""
    found = []
    for name, path in known.items():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        tree = ast.parse(text, filename=str(path))
        local = sorted(_local_nodes(tree), key=lambda n: n.lineno)
        ends = {n.end_lineno for n in local}
        for node in local:
            own = lines[node.lineno - 1 : node.end_lineno]
            above = node.lineno  # the first line of the run of imports this one belongs to
            while above - 1 in ends or (above - 2 in ends and not lines[above - 2].strip()):
                gap = 1 if above - 1 in ends else 2
                above = min(n.lineno for n in local if n.end_lineno == above - gap)
            before = lines[above - 2].strip() if above >= 2 else ""
            if not any("#" in line for line in own) and not before.startswith("#"):
                found.append(f"{name}:{node.lineno} {lines[node.lineno - 1].strip()}")
    return found


def _local_nodes(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    return [
        node
        for func in ast.walk(tree)
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef))
        for node in ast.walk(func)
        if isinstance(node, (ast.Import, ast.ImportFrom))
    ]


# -- layers -----------------------------------------------------------------------------------------------

# A module's layer: the first prefix that matches (ARCHITECTURE.md draws the same picture).
LAYERS = (
    ("runs.domain", "domain"),
    ("runs.tools", "tools"),
    ("runs.providers", "providers"),
    ("runs.store", "store"),
    ("checkpoints", "checkpoints"),
    ("runs.runtime", "runtime"),
    ("runs.tasks", "runtime"),
    ("runs.services", "services"),
    ("runs.api", "api"),
    ("runs.web", "web"),
    ("approvals", "approvals"),
    ("maintenance", "maintenance"),
    ("ops", "ops"),
    ("webhooks.api", "api"),  # the subscriptions' REST routes, built on the runs API's views and serializers
    ("webhooks", "webhooks"),  # subscriptions, the outbox (an intent's handler), delivery, its admin
    ("runs", "app"),  # the runs app's root: models, admin, apps, errors, clock, management commands
    ("agentrt_site", "site"),  # settings, URLs, ASGI, the login and cookie middleware: the outermost
    ("bench", "bench"),  # the benchmarks: scripts over the whole project, imported by none of it
)
_INNER = {"domain", "tools", "providers", "store", "checkpoints"}
_CORE = {"runtime", "services", "approvals", "maintenance", "ops", "webhooks"}
_ADAPTERS = {"api", "web"}
# layer -> the layers it must not import
FORBIDDEN: dict[str, set[str]] = {
    "domain": {layer for _, layer in LAYERS} - {"domain"},
    **{inner: {*_CORE, *_ADAPTERS, "site", "bench"} for inner in _INNER},
    **{core: {*_ADAPTERS, "site", "bench"} for core in _CORE},
    "api": {"web", "site", "bench"},
    "web": {"site", "bench"},
    "app": {"bench"},
    "site": {"bench"},
}
# Known, deliberate crossings: (module, module it imports) -> why. None: what joins a commit is an intent
# (runs.domain.writes) whose handler the composition root registers, so the store imports nothing above it.
EXCEPTIONS: dict[tuple[str, str], str] = {}


def layer_of(module: str) -> str | None:
    """The layer of the first row whose prefix is `module` or a package of it; None when no row covers it."""
    return next((layer for prefix, layer in LAYERS if module == prefix or module.startswith(prefix + ".")), None)


def unlayered(packages: tuple[str, ...] = PACKAGES, layers: tuple[tuple[str, str], ...] = LAYERS) -> list[str]:
    """The walked packages (every app of INSTALLED_APPS, the site, bench) with no row of their own in the
    layer table: the row whose prefix is the package, which places every module of it no narrower row names.
    An app added to the settings fails the gate until ARCHITECTURE.md and `LAYERS` say where it sits."""
    rows = {prefix for prefix, _ in layers}
    return [package for package in packages if package not in rows]


def layer_violations(known: dict[str, Path]) -> list[Edge]:
    """Imports that go from an inner layer outwards (the domain imports none of the project)."""
    return [
        e
        for e in edges(known)
        if layer_of(e.target) in FORBIDDEN.get(layer_of(e.source) or "", set()) and not _excepted(e)
    ]


def _excepted(edge: Edge) -> bool:
    """An exception covers its module and the packages loaded on the way to it."""
    return any(
        edge.source == source and (edge.target == target or target.startswith(edge.target + "."))
        for source, target in EXCEPTIONS
    )
