"""No import cycle between the project's modules (issue 12 item 3), function-local imports included; every
app of INSTALLED_APPS walked and placed in a layer (issue 35 item 2)."""

from __future__ import annotations

from pathlib import Path

from tests.gates.apps import APPS, SITE, installed_apps, project_apps
from tests.gates.imports import (
    EXCEPTIONS,
    LAYERS,
    PACKAGES,
    ROOT,
    cycles,
    edges,
    layer_of,
    layer_violations,
    modules,
    unexplained_local_imports,
    unlayered,
)
from tests.gates.structure import RUNTIME_PACKAGES
from tests.gates.vocabulary import SCANNED_PACKAGES

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "planted_cycle"
LAYERED = Path(__file__).resolve().parent / "fixtures" / "planted_layers"
PLANTED_APPS = Path(__file__).resolve().parent / "fixtures" / "planted_apps"


def test_the_apps_are_read_from_installed_apps_and_every_gate_walks_them():
    """One list: the installed apps that are packages of this repository, in the settings' order."""
    assert APPS == ("runs", "approvals", "checkpoints", "maintenance", "ops", "webhooks")
    assert set(APPS) <= {entry.split(".")[0] for entry in installed_apps()}
    assert RUNTIME_PACKAGES == SCANNED_PACKAGES == APPS
    assert PACKAGES == (*APPS, SITE, "bench")


def test_the_app_list_keeps_the_projects_apps_and_leaves_libraries_out():
    assert project_apps(PLANTED_APPS, PLANTED_APPS / "settings.py") == ("layered", "unlayered")


def test_every_app_the_site_and_bench_have_a_layer_row():
    known = modules()

    assert unlayered() == [], "add a row to tests/gates/imports.py LAYERS (and ARCHITECTURE.md's table)"
    assert [m for m in known if layer_of(m) is None] == []


def test_the_layer_row_gate_catches_the_planted_app():
    apps = project_apps(PLANTED_APPS, PLANTED_APPS / "settings.py")

    assert unlayered(apps, (("layered.sub", "inner"), ("layered", "outer"))) == ["unlayered"]
    assert unlayered(apps, (("layered.sub", "inner"),)) == ["layered", "unlayered"]  # a narrower row is not enough
    assert unlayered(apps, LAYERS) == ["layered", "unlayered"]


def test_the_apps_have_no_import_cycle():
    found = cycles(modules())

    assert found == [], "\n\n".join("\n".join(str(e) for e in cycle) for cycle in found)


def test_the_gate_reads_the_whole_project_and_its_function_local_imports():
    """Not vacuous: every app is walked, and the graph holds the edges we know of, function-local ones too."""
    known = modules()
    graph = {(e.source, e.target): e for e in edges(known)}

    assert {name.split(".")[0] for name in known} == set(PACKAGES)
    assert ROOT / "runs/runtime/executor.py" in known.values()
    assert ("runs.runtime.executor", "runs.runtime.resume") in graph
    assert ("runs.runtime.resume", "runs.runtime.finalize") in graph
    assert graph[("runs.apps", "runs.runtime.wiring")].local  # the app's ready() wires the runtime


def test_the_gate_catches_the_planted_cycles():
    """The fixture plants two: a -> b at the top and b -> a inside a function (how executor <-> resume hid);
    web -> services.scoping, which first runs the services facade, whose submit imports web (how store ->
    wake -> web consumers -> services -> finalize -> store hid behind `from runs.services import scoping`)."""
    found = cycles(modules(FIXTURES, ("pkg",)))

    assert sorted({(e.source, e.target, e.local) for e in cycle} for cycle in found) == sorted(
        [
            {("pkg.a", "pkg.b", False), ("pkg.b", "pkg.a", True)},
            {
                ("pkg.web", "pkg.services", False),
                ("pkg.services", "pkg.services.submit", False),
                ("pkg.services.submit", "pkg.web", False),
            },
        ],
        key=sorted,
    )


def test_every_function_local_import_of_the_apps_says_why_it_is_not_at_the_top():
    found = unexplained_local_imports(modules())

    assert found == [], "move these to the top of their module, or say why not:\n" + "\n".join(found)


def test_the_reason_gate_catches_the_planted_unexplained_import():
    assert unexplained_local_imports(modules(FIXTURES, ("pkg",))) == ["pkg.e:2 from pkg.c import LATER"]


def test_the_gate_resolves_relative_and_package_imports():
    known = modules(FIXTURES, ("pkg",))
    targets = {(e.source, e.target) for e in edges(known)}

    assert ("pkg.c", "pkg.a") in targets  # `from .a import VALUE` from a module of pkg
    assert ("pkg", "pkg.c") in targets  # the package's __init__ re-exports c


def test_no_layer_imports_an_outer_one():
    found = layer_violations(modules())

    assert found == [], "\n".join(str(e) for e in found)


def test_every_module_has_a_layer_and_each_exception_is_a_real_import():
    known = modules()
    graph = {(e.source, e.target) for e in edges(known)}

    assert {layer_of(m) for m in known} >= {
        "domain",
        "store",
        "runtime",
        "services",
        "api",
        "web",
        "app",
        "webhooks",
        "ops",
        "maintenance",
        "site",
        "bench",
    }
    assert set(EXCEPTIONS) <= graph  # an exception nobody needs any more is removed


def test_the_layer_gate_catches_the_planted_violations():
    found = {(e.source, e.target) for e in layer_violations(modules(LAYERED, ("runs",)))}

    assert found == {
        ("runs.domain.loop", "runs.services"),
        ("runs.domain.loop", "runs.services.api"),
        ("runs.services.api", "runs.web"),
        ("runs.services.api", "runs.web.page"),
        ("runs.store.events", "runs.runtime"),
        ("runs.store.events", "runs.runtime.wake"),
    }
