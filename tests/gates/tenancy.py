"""The one-scoping-module gate (issue 12 item 5): the surfaces a user reaches —
REST, the pages, the admin, the sockets — never filter by tenant themselves;
they ask runs.services.scoping (`tenant_for`, `runs_visible_to`,
`approvals_visible_to`, `scope`, ...). A query keyword on a tenant
(`tenant`, `tenant_id`, `tenant__…`, `run__tenant…`) or a read of
`Membership` in a surface file is reported. Parsed, never imported."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

from tests.gates.structure import ROOT, Violation, rel

SURFACES = ("runs/web", "runs/api", "runs/admin.py", "approvals/admin.py", "ops/views.py")
QUERY_METHODS = {"filter", "exclude", "get", "get_or_create", "update_or_create", "first", "values", "annotate"}


def surface_files(root: Path = ROOT) -> list[Path]:
    files: list[Path] = []
    for surface in SURFACES:
        path = root / surface
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return [f for f in files if f.exists() and "__pycache__" not in f.parts]


def _tenant_keyword(name: str | None) -> bool:
    if name is None:
        return False
    parts = name.split("__")
    return "tenant" in parts or "tenant_id" in parts


def tenant_filter_violations(paths: Iterable[Path], root: Path = ROOT) -> list[Violation]:
    found = []
    for path in paths:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in QUERY_METHODS:
                    for kw in node.keywords:
                        if _tenant_keyword(kw.arg):
                            found.append(
                                Violation(
                                    "tenant-filter",
                                    rel(path, root),
                                    node.lineno,
                                    f"a hand-written tenant filter ({kw.arg}=): ask runs.services.scoping",
                                )
                            )
            elif isinstance(node, ast.Attribute) and node.attr == "objects":
                if isinstance(node.value, ast.Name) and node.value.id == "Membership":
                    found.append(
                        Violation(
                            "tenant-filter",
                            rel(path, root),
                            node.lineno,
                            "Membership read outside runs.services.scoping",
                        )
                    )
    return sorted(found, key=lambda v: (v.path, v.line))
