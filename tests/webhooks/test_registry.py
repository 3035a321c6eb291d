"""The post-run hook registry: AGENTRT_HOOK_MODULES and autodiscovered
`agent_hooks` modules; a module that fails to import stops the process,
naming the module and its error."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
from django.core.exceptions import ImproperlyConfigured

from runs import hooks
from tests.conftest import ROOT, subprocess_env


@pytest.fixture(autouse=True)
def _restore_registry():
    before = hooks.registered()
    yield
    hooks._HOOKS.clear()
    hooks._HOOKS.update(before)


def fake_apps(monkeypatch, *names):
    import importlib

    from django.apps import apps

    configs = [SimpleNamespace(name=n, module=importlib.import_module(n)) for n in names]
    monkeypatch.setattr(apps, "get_app_configs", lambda: configs)


def test_modules_from_the_setting_and_agent_hooks_of_installed_apps_are_loaded(settings, monkeypatch):
    settings.AGENTRT_HOOK_MODULES = ["tests.webhooks.hookmods"]
    fake_apps(monkeypatch, "tests.webhooks.fakeapp", "tests.webhooks")  # tests.webhooks has no agent_hooks: skipped
    hooks.load_hook_modules()
    assert {"test.record", "test.explode", "fakeapp.discovered"} <= set(hooks.registered())


def test_a_hook_module_that_fails_to_import_is_named_with_its_error(settings, monkeypatch):
    settings.AGENTRT_HOOK_MODULES = ["tests.webhooks.broken_hooks"]
    with pytest.raises(
        ImproperlyConfigured,
        match=r"'tests\.webhooks\.broken_hooks': ImportError: this hook module is broken on purpose",
    ):
        hooks.load_hook_modules()
    settings.AGENTRT_HOOK_MODULES = ["tests.webhooks.no_such_module"]
    with pytest.raises(ImproperlyConfigured, match=r"'tests\.webhooks\.no_such_module': ModuleNotFoundError"):
        hooks.load_hook_modules()
    settings.AGENTRT_HOOK_MODULES = []
    fake_apps(monkeypatch, "tests.webhooks.brokenapp")
    with pytest.raises(
        ImproperlyConfigured,
        match=r"'tests\.webhooks\.brokenapp\.agent_hooks': ValueError: brokenapp's hooks cannot load",
    ):
        hooks.load_hook_modules()


def test_a_process_with_a_broken_hook_module_does_not_start():
    env = subprocess_env(AGENTRT_HOOK_MODULES="tests.webhooks.hookmods,tests.webhooks.broken_hooks")
    env.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    done = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert (
        "post-run hooks: cannot import 'tests.webhooks.broken_hooks': "
        "ImportError: this hook module is broken on purpose" in done.stderr
    )


def test_register_refuses_bad_names_and_a_second_function_under_one_name():
    with pytest.raises(ValueError):
        hooks.register("")
    with pytest.raises(ValueError):
        hooks.register("x" * 201)
    hooks.register("t.same")(lambda v: 1)
    with pytest.raises(ValueError, match="already registered"):
        hooks.register("t.same")(print)
