"""The project's own apps, read from `INSTALLED_APPS` in agentrt_site/settings.py: the one list every gate
walks (imports, layers, vocabulary, structure). An app added to the settings is walked by every gate at
once, and `tests/gates/test_import_cycles.py` fails until it has a layer row.

Read with an AST walk of the settings module (no Django set-up): the entries of the `INSTALLED_APPS = [...]`
literal whose top-level package is a directory of this repository with an `apps.py` or `models.py` (ours,
not a library's). `AGENTRT_EXTRA_APPS` (an operator's own apps, added at run time) are not the project's."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ROOT / "agentrt_site" / "settings.py"
SITE = "agentrt_site"  # the project package (settings, urls, ASGI): not an app, walked by the import gates


def installed_apps(settings: Path = SETTINGS) -> list[str]:
    """The literal `INSTALLED_APPS = [...]` of a settings module, in order."""
    tree = ast.parse(settings.read_text(encoding="utf-8"), filename=str(settings))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "INSTALLED_APPS" for t in node.targets
        ):
            return [ast.literal_eval(e) for e in node.value.elts]  # type: ignore[attr-defined]
    raise AssertionError(f"{settings}: no INSTALLED_APPS = [...] literal")


def project_apps(root: Path = ROOT, settings: Path = SETTINGS) -> tuple[str, ...]:
    """The installed apps that are packages of this repository."""
    out = []
    for entry in installed_apps(settings):
        package = entry.split(".")[0]
        folder = root / package
        if folder.is_dir() and ((folder / "apps.py").exists() or (folder / "models.py").exists()):
            out.append(package)
    return tuple(dict.fromkeys(out))


APPS = project_apps()
