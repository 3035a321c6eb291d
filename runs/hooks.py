"""Post-run hooks.

    from runs import hooks

    @hooks.register("notify-crm")
    def notify_crm(run_view):
        ...  # run_view.run is the run in its REST shape (a copy)

A hook runs after the run's terminal transition has committed, never inside
it and never in the run's worker step: the transition writes one delivery
row per registered hook in its own transaction (a crash cannot lose it) and
rings a django-q2 task; a worker then calls the hook with a read-only view.
A hook runs at least once per (run, hook) under a stable delivery id
(`run_view.delivery`); one that raises is retried with backoff and then
marked failed (visible in the admin: Webhooks › Deliveries). Nothing a hook
does or raises changes the run's outcome: the run is already terminal.

Hooks come from the modules named in AGENTRT_HOOK_MODULES (comma-separated)
and from each installed app's `agent_hooks` module, imported when Django
starts (webhooks.apps). A module that fails to import stops the process
with the module and the error named. Configure every node the same way: the
process that ends a run (worker, web node, maintenance) decides which hooks
are enqueued, and a worker runs them.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import module_has_submodule
from pydantic import BaseModel, ConfigDict

_HOOKS: dict[str, Callable[[RunView], Any]] = {}
MAX_NAME = 200


class RunView(BaseModel):
    """What a hook sees: copies. Changing it changes nothing."""

    model_config = ConfigDict(frozen=True)

    run: dict[str, Any]  # the run's REST shape (status, failure, final_message, usage, ...)
    tenant: str  # the tenant's name
    event: str  # run.completed, run.failed or run.cancelled
    delivery: str  # the delivery id: stable across retries, for deduplication
    attempt: int  # 1 on the first attempt


def register(name: str):
    """Register `fn(run_view)` as the post-run hook `name`."""
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME:
        raise ValueError(f"a hook name is a non-empty string of at most {MAX_NAME} characters, not {name!r}")

    def decorate(fn):
        if not callable(fn):
            raise TypeError(f"hook {name!r}: {fn!r} is not callable")
        existing = _HOOKS.get(name)
        if existing is not None and existing is not fn and _qualname(existing) != _qualname(fn):
            raise ValueError(f"hook {name!r} is already registered by {_qualname(existing)}")
        _HOOKS[name] = fn
        return fn

    return decorate


def unregister(name: str) -> None:
    _HOOKS.pop(name, None)


def registered() -> dict[str, Callable]:
    return dict(_HOOKS)


def _qualname(fn) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def load_hook_modules() -> None:
    """Import AGENTRT_HOOK_MODULES, then every installed app's `agent_hooks`."""

    names = list(getattr(settings, "AGENTRT_HOOK_MODULES", []) or [])
    names += [
        f"{app.name}.agent_hooks" for app in apps.get_app_configs() if module_has_submodule(app.module, "agent_hooks")
    ]
    for name in names:
        try:
            import_module(name)
        except Exception as exc:
            raise ImproperlyConfigured(f"post-run hooks: cannot import {name!r}: {type(exc).__name__}: {exc}") from exc
