"""The import-graph gate (issue 12 item 3): no import cycle between the project's modules.

An AST walk (no code is imported) collects every import of every module under the apps — at the top of the
module and inside functions alike, since a function-local import is how a cycle hides — resolves each to the
project module it loads (`from a.b import c` is the module `a.b.c` when that is a module, else `a.b`), and
reports each strongly connected component of two or more modules. An import that names a package loads its
`__init__`; the implicit load of a parent package by `import a.b.c` is not an edge (Python allows it, and
every package whose `__init__` re-exports its submodules would otherwise be a cycle)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("runs", "approvals", "checkpoints", "maintenance", "ops")


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


def _local_lines(tree: ast.Module) -> set[int]:
    return {
        node.lineno
        for func in ast.walk(tree)
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef))
        for node in ast.walk(func)
        if isinstance(node, (ast.Import, ast.ImportFrom))
    }


def edges(known: dict[str, Path]) -> list[Edge]:
    out = []
    for source, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        local = _local_lines(tree)
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
            for target in dict.fromkeys(_resolve(name, known) for name in names):
                if target is not None and target != source:
                    out.append(Edge(source, target, node.lineno, node.lineno in local))
    return out


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
