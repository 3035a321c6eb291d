"""Model endpoints: where model calls go and which key they carry.

Operator configuration only. An agent definition names an
endpoint (`"model": {"provider": "openai", "endpoint": "local", ...}`); it can
never say where a request goes or which environment variable becomes the
Bearer token. The operator declares endpoints in `AGENTRT_MODEL_ENDPOINTS`:

    {"local": {"provider": "openai", "base_url": "http://127.0.0.1:11434/v1",
               "api_key_env": "OLLAMA_API_KEY", "models": ["llama3.1:8b"]}}

`models` is optional; when given, an agent may name only those models.
`provider` names a provider that takes endpoints — an entry of the provider
registry (`runs.providers.registry`) declared with `endpoint=True`, built in
or a project's. A provider may also declare a built-in endpoint of its own
(`openai`: https://api.openai.com/v1 with `OPENAI_API_KEY`; `anthropic`:
https://api.anthropic.com/v1 with `ANTHROPIC_API_KEY`), which exists unless
the setting defines one with that name. So a new endpoint provider is one
file: its registry entry says all of this.

settings.py checks the setting's shape with `parse_endpoints` before the
apps (and so the providers) are loaded — this module never imports the
registry at module level — and `runs.extensions` checks the provider names
once they are; either stops the process with an error naming the bad key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,199}$")
_KEYS = {"provider", "base_url", "api_key_env", "models"}
SETTING = "AGENTRT_MODEL_ENDPOINTS"


class EndpointConfigError(ValueError):
    """`AGENTRT_MODEL_ENDPOINTS` is invalid; the message names the bad key."""


@dataclass(frozen=True)
class Endpoint:
    name: str
    provider: str
    base_url: str
    api_key_env: str
    models: tuple[str, ...] | None = None

    def allows(self, model: str) -> bool:
        return self.models is None or model in self.models

    def shown_url(self) -> str:
        """The base URL without any user:password@ (for operator logs)."""
        parts = urlsplit(self.base_url)
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        return parts._replace(netloc=netloc).geturl()


# The provider registry, handed over by runs.providers.registry when it
# loads (it imports this module, so this module cannot import it). Importing
# this module runs runs/providers/__init__.py first, which loads the registry:
# it is always here before anything below is called.
_PROVIDERS: Any = None


def use_registry(providers: Any) -> None:
    global _PROVIDERS
    _PROVIDERS = providers


def _registry() -> Any:
    if _PROVIDERS is None:  # pragma: no cover - see above
        raise RuntimeError("the provider registry (runs.providers.registry) is not loaded")
    return _PROVIDERS


def known_providers() -> frozenset[str]:
    """The registered providers that take an endpoint (built in or a project's)."""
    return frozenset(_registry().endpoint_providers())


def builtin_endpoints() -> dict[str, dict[str, Any]]:
    """The endpoints providers declare for themselves (`openai`, `anthropic`)."""
    return _registry().builtin_endpoints()


def _endpoint(name: Any, entry: Any, providers: frozenset[str] | None = None) -> Endpoint:
    where = f"{SETTING}[{name!r}]"
    if not isinstance(name, str) or not NAME.match(name):
        raise EndpointConfigError(f"{where}: an endpoint name is letters, digits, '_', '.', '-' (at most 100)")
    if not isinstance(entry, Mapping):
        raise EndpointConfigError(f"{where}: must be an object with provider, base_url, api_key_env")
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise EndpointConfigError(f"{where}: unknown keys {unknown} (allowed: {', '.join(sorted(_KEYS))})")
    for key in ("provider", "base_url", "api_key_env"):
        if key not in entry:
            raise EndpointConfigError(f"{where}.{key}: required")
        if not isinstance(entry[key], str) or not entry[key]:
            raise EndpointConfigError(f"{where}.{key}: must be a non-empty string")
    if providers is not None and entry["provider"] not in providers:
        raise EndpointConfigError(f"{where}.provider: must be one of {', '.join(sorted(providers))}")
    if not NAME.match(entry["provider"]):
        raise EndpointConfigError(f"{where}.provider: a provider name is letters, digits, '_', '.', '-'")
    parts = urlsplit(entry["base_url"])
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EndpointConfigError(f"{where}.base_url: must be an http(s) URL with a host")
    if not ENV_NAME.match(entry["api_key_env"]):
        raise EndpointConfigError(f"{where}.api_key_env: must be an environment variable name")
    models = entry.get("models")
    if models is not None:
        if not isinstance(models, list) or not models or not all(isinstance(m, str) and m for m in models):
            raise EndpointConfigError(f"{where}.models: must be a non-empty list of model names")
        models = tuple(models)
    return Endpoint(
        name=name,
        provider=entry["provider"],
        base_url=entry["base_url"].rstrip("/"),
        api_key_env=entry["api_key_env"],
        models=models,
    )


def parse_endpoints(raw: str | Mapping[str, Any] | None, *, check_provider: bool = True) -> dict[str, dict[str, Any]]:
    """Validate the setting (JSON text or an already-decoded object) and
    return it as plain data; raise EndpointConfigError naming the bad key.
    With `check_provider=False` (settings time, before a project's providers
    are registered) a provider name is only checked for shape."""
    providers = known_providers() if check_provider else None
    if raw is None or raw == "":
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise EndpointConfigError(f"{SETTING}: not valid JSON ({exc.msg} at position {exc.pos})") from None
        except ValueError as exc:  # e.g. an integer longer than Python's digit limit
            raise EndpointConfigError(f"{SETTING}: not valid JSON ({exc})") from None
    if not isinstance(raw, Mapping):
        raise EndpointConfigError(f"{SETTING}: must be a JSON object of endpoint name -> endpoint")
    out: dict[str, dict[str, Any]] = {}
    for name, entry in raw.items():
        ep = _endpoint(name, entry, providers)
        out[name] = {"provider": ep.provider, "base_url": ep.base_url, "api_key_env": ep.api_key_env}
        if ep.models is not None:
            out[name]["models"] = list(ep.models)
    return out


def configured() -> dict[str, Endpoint]:
    """Every endpoint: the built-in ones, then the operator's (which override)."""
    table: Mapping[str, Any] | None = None
    try:
        if settings.configured:
            table = getattr(settings, SETTING, None)
    except ImportError:  # pragma: no cover - Django is always installed here
        pass
    merged: dict[str, Any] = builtin_endpoints()
    merged.update(parse_endpoints(table, check_provider=False) if table else {})
    providers = known_providers()
    return {name: _endpoint(name, entry, providers) for name, entry in merged.items()}


def endpoint_for(name: str) -> Endpoint | None:
    return configured().get(name)


__all__ = [
    "Endpoint",
    "EndpointConfigError",
    "parse_endpoints",
    "configured",
    "endpoint_for",
    "builtin_endpoints",
    "known_providers",
]
