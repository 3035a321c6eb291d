"""Discovery of a project's tools and providers.

Every process that sets Django up (web, worker, maintenance, any management
command) calls `load()` from `RunsConfig.ready()`:

1. the modules named in `AGENTRT_PROVIDER_MODULES` and `AGENTRT_TOOL_MODULES`
   (comma-separated dotted paths, operator configuration — never tenant
   input) are imported;
2. an `agent_providers` and an `agent_tools` module in each installed app are
   imported when the app has one, the way the admin finds `admin.py`;
3. the tools of the MCP servers in `AGENTRT_MCP_SERVERS` are registered
   (runs.tools.mcp; a bad value names the field).

A module that fails to import, two tools (or providers) with one name, or a
configured model endpoint whose provider nobody registered stops the process
with `ImproperlyConfigured` naming the module and the error. The registries
are restored to what they held before, so nothing half-registered survives
in a process that catches the error (a test, a shell).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import module_has_submodule

from runs.providers.endpoints import SETTING
from runs.providers.registry import PROVIDERS
from runs.tools import mcp
from runs.tools.registry import REGISTRY

TOOL_SETTING = "AGENTRT_TOOL_MODULES"
PROVIDER_SETTING = "AGENTRT_PROVIDER_MODULES"
TOOL_MODULE = "agent_tools"
PROVIDER_MODULE = "agent_providers"


def module_paths(value: str | Iterable[str] | None, setting: str) -> list[str]:
    """The dotted paths of a setting: a comma-separated string or a list."""
    if not value:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    paths = []
    for item in items:
        if not isinstance(item, str):
            raise ImproperlyConfigured(f"{setting}: every entry must be a dotted module path, not {item!r}")
        item = item.strip()
        if not item:
            continue
        if not all(part.isidentifier() for part in item.split(".")):
            raise ImproperlyConfigured(f"{setting}: {item!r} is not a dotted module path")
        paths.append(item)
    return paths


def _import(path: str, where: str) -> None:
    try:
        importlib.import_module(path)
    except ImproperlyConfigured:
        raise
    except Exception as exc:
        raise ImproperlyConfigured(f"{where}: could not import {path!r}: {type(exc).__name__}: {exc}") from exc


def _app_modules(name: str) -> list[str]:
    found = []
    for config in apps.get_app_configs():
        if module_has_submodule(config.module, name):
            found.append(f"{config.name}.{name}")
    return found


def load() -> None:
    """Import every configured and discovered tool and provider module."""

    tools, providers = REGISTRY.snapshot(), PROVIDERS.snapshot()
    try:
        for path in module_paths(getattr(settings, PROVIDER_SETTING, ""), PROVIDER_SETTING):
            _import(path, PROVIDER_SETTING)
        for path in _app_modules(PROVIDER_MODULE):
            _import(path, f"the installed app module {path}")
        for path in module_paths(getattr(settings, TOOL_SETTING, ""), TOOL_SETTING):
            _import(path, TOOL_SETTING)
        for path in _app_modules(TOOL_MODULE):
            _import(path, f"the installed app module {path}")
        mcp.load()  # AGENTRT_MCP_SERVERS: after the project's tools, whose names an MCP tool may not take
        check_endpoints()
    except BaseException:
        REGISTRY.restore(tools)
        PROVIDERS.restore(providers)
        raise


def check_endpoints() -> None:
    """Every configured model endpoint names a provider that takes endpoints."""

    table = getattr(settings, SETTING, None) or {}
    known = PROVIDERS.endpoint_providers()
    for name, entry in table.items():
        provider = entry.get("provider") if isinstance(entry, dict) else None
        if provider not in known:
            raise ImproperlyConfigured(
                f"{SETTING}[{name!r}].provider: must be one of {', '.join(sorted(known))} "
                f"(a project provider is registered from {PROVIDER_SETTING} or an app's {PROVIDER_MODULE} module)"
            )
