"""Model providers by declaration.

A provider is one registry entry: its name (the agent block's `provider`
tag), its pydantic config model (the agent block's schema), the function that
builds the adapter, whether it streams text deltas, its price check, whether
it sends requests to an operator-configured endpoint
(`AGENTRT_MODEL_ENDPOINTS`) and, if it has one, its built-in endpoint (a
base URL and the variable holding the key). Everything that used to test a
provider's name is derived from here: the agent schema's union and the tags
left out of error-field names (`runs.services.agent_schema`), `provider_for`,
the price check at agent validation (`prices.check_model_priced`), whether
the executor attaches the delta batcher (`provider_streams`), the providers
an endpoint may name and the built-in endpoints (`endpoints.configured`).

    @register_provider("acme", config=AcmeModel, streams=True, endpoint=True,
                       price_check=prices.require_price,
                       base_url="https://api.acme.example/v1", api_key_env="ACME_API_KEY")
    def build(endpoint, block, on_delta):
        return AcmeProvider(endpoint, block["model"], on_delta=on_delta)

An endpoint provider's `build(endpoint, block, on_delta)` is called only with
an `Endpoint` the operator configured for this provider and that serves the
model; a block carrying `base_url`/`api_key_env` is refused before any
request. Any other provider's `build(block, on_delta)` gets the block.

A project registers its own from a module named in `AGENTRT_PROVIDER_MODULES`
or an installed app's `agent_providers` module (`runs.extensions`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from runs.domain.errors import ModelError
from runs.domain.values import ModelTurn, StopReason
from runs.providers import endpoints
from runs.providers.endpoints import EndpointConfigError, endpoint_for, parse_endpoints

log = logging.getLogger("agentrt.providers")


class DuplicateProvider(ValueError):
    """Two different providers were registered under one name."""


@dataclass(frozen=True)
class ProviderEntry:
    name: str
    config: type[BaseModel]
    build: Callable[..., Any]
    streams: bool = False
    price_check: Callable[[Any], Any] | None = None
    endpoint: bool = False
    default_endpoint: str | None = None
    base_url: str | None = None  # the built-in endpoint `default_endpoint`, when the provider has one
    api_key_env: str | None = None
    origin: str = ""

    def builtin_endpoint(self) -> dict[str, Any] | None:
        if self.base_url is None or self.api_key_env is None:
            return None
        return {"provider": self.name, "base_url": self.base_url, "api_key_env": self.api_key_env}


class ProviderRegistry:
    def __init__(self):
        self._entries: dict[str, ProviderEntry] = {}
        self._listeners: list[Callable[[], None]] = []
        self._lock = threading.RLock()
        self.version = 0

    def register(self, entry: ProviderEntry) -> None:
        field = entry.config.model_fields.get("provider")
        if field is None or getattr(field.annotation, "__args__", None) != (entry.name,):
            raise TypeError(f"provider {entry.name!r}: its config model needs `provider: Literal[{entry.name!r}]`")
        builtin = _check_builtin_endpoint(entry)
        with self._lock:
            held = self._entries.get(entry.name)
            if held is not None and held.origin != entry.origin:
                raise DuplicateProvider(
                    f"two providers are named {entry.name!r}: {held.origin} and {entry.origin} (names are unique)"
                )
            if builtin is not None:
                taken = next(
                    (
                        e
                        for e in self._entries.values()
                        if e.name != entry.name
                        and e.builtin_endpoint()
                        and e.default_endpoint == entry.default_endpoint
                    ),
                    None,
                )
                if taken is not None:
                    raise DuplicateProvider(
                        f"providers {taken.name!r} and {entry.name!r} both declare the built-in endpoint "
                        f"{entry.default_endpoint!r}"
                    )
            self._entries[entry.name] = entry
            self.version += 1
        self._changed()

    def on_change(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in list(self._listeners):
            listener()

    def get(self, name: Any) -> ProviderEntry | None:
        return self._entries.get(name) if isinstance(name, str) else None

    def names(self) -> list[str]:
        return list(self._entries)

    def configs(self) -> list[type[BaseModel]]:
        return [entry.config for entry in self._entries.values()]

    def endpoint_providers(self) -> set[str]:
        return {name for name, entry in self._entries.items() if entry.endpoint}

    def builtin_endpoints(self) -> dict[str, dict[str, Any]]:
        """Endpoint name -> entry, for each provider that declares a built-in endpoint."""
        found = {}
        for entry in list(self._entries.values()):
            builtin = entry.builtin_endpoint()
            if builtin is not None and entry.default_endpoint is not None:
                found[entry.default_endpoint] = builtin
        return found

    def union_tags(self) -> frozenset[str]:
        """The names pydantic puts in an error's location for the union's
        member (tag, class name): left out of the field names users see."""
        tags = set(self._entries)
        tags.update(entry.config.__name__ for entry in self._entries.values())
        return frozenset(tags)

    def snapshot(self) -> dict[str, ProviderEntry]:
        with self._lock:
            return dict(self._entries)

    def restore(self, snapshot: dict[str, ProviderEntry]) -> None:
        with self._lock:
            changed = snapshot != self._entries
            self._entries = dict(snapshot)
            self.version += 1
        if changed:
            self._changed()

    def unregister(self, name: str) -> None:
        with self._lock:
            self._entries.pop(name, None)
            self.version += 1
        self._changed()


def _check_builtin_endpoint(entry: ProviderEntry) -> dict[str, Any] | None:
    """A declared built-in endpoint is whole, belongs to an endpoint provider
    and has the shape an operator's entry must have."""
    if entry.base_url is None and entry.api_key_env is None:
        return None
    if not entry.endpoint:
        raise TypeError(
            f"provider {entry.name!r}: base_url/api_key_env declare a built-in endpoint: needs endpoint=True"
        )
    if entry.base_url is None or entry.api_key_env is None or entry.default_endpoint is None:
        raise TypeError(f"provider {entry.name!r}: a built-in endpoint needs both base_url and api_key_env")
    builtin = entry.builtin_endpoint()
    try:
        parse_endpoints({entry.default_endpoint: builtin}, check_provider=False)
    except EndpointConfigError as exc:
        detail = str(exc).replace(f"AGENTRT_MODEL_ENDPOINTS[{entry.default_endpoint!r}].", "")
        raise TypeError(f"provider {entry.name!r}: its built-in endpoint's {detail}") from None
    return builtin


PROVIDERS = ProviderRegistry()
endpoints.use_registry(PROVIDERS)  # endpoints reads the providers that take one


def register_provider(
    name: str,
    *,
    config: type[BaseModel],
    streams: bool = False,
    price_check: Callable[[Any], Any] | None = None,
    endpoint: bool = False,
    default_endpoint: str | None = None,
    base_url: str | None = None,
    api_key_env: str | None = None,
):
    """Decorator: register `build` as the factory of provider `name`.

    `endpoint=True`: the provider calls an operator-configured endpoint
    (`AGENTRT_MODEL_ENDPOINTS` entries may name it); a block without
    `endpoint` uses `default_endpoint` (the provider's name). `base_url` and
    `api_key_env` declare that default as a built-in endpoint, which exists
    unless the operator defines one with that name."""

    def wrap(build):
        PROVIDERS.register(
            ProviderEntry(
                name=name,
                config=config,
                build=build,
                streams=streams,
                price_check=price_check,
                endpoint=endpoint,
                default_endpoint=default_endpoint or (name if endpoint else None),
                base_url=base_url,
                api_key_env=api_key_env,
                origin=f"{getattr(build, '__module__', '?')}.{getattr(build, '__qualname__', repr(build))}",
            )
        )
        return build

    return wrap


class RefusingProvider:
    """A model block the worker will not honour: every attempt is a permanent
    `ModelError` with a tenant-safe message (no URL, no variable name)."""

    def __init__(self, error_class: str, message: str):
        self.error_class = error_class
        self.message = message

    def complete(self, request, token) -> ModelTurn:
        if token.reason is not None:
            return ModelTurn(stop_reason=StopReason.CANCELLED)
        raise ModelError(self.error_class, self.message, transient=False)


def provider_for(model: dict, on_delta=None):
    """Return the adapter an agent's `model` block names.

    An endpoint provider's block names an operator-configured endpoint; a
    block that carries its own `base_url` or `api_key_env` (an agent version
    stored before endpoints existed) is never honoured: the run fails
    `model_permanent_error` / `LegacyModelBlock` without a request being sent.
    """
    kind = model.get("provider")
    entry = PROVIDERS.get(kind)
    if entry is None:
        raise ValueError(f"unknown model provider {kind!r}")
    if not entry.endpoint:
        return entry.build(model, on_delta)

    if "base_url" in model or "api_key_env" in model:
        log.warning(
            "refusing a stored model block with base_url/api_key_env (publish a version that names an endpoint)"
        )
        return RefusingProvider(
            "LegacyModelBlock",
            "this agent version names its own model server (base_url/api_key_env), which is no longer honoured; "
            "publish a new version whose model block names an endpoint",
        )
    name = model.get("endpoint") or entry.default_endpoint
    endpoint = endpoint_for(name) if isinstance(name, str) else None
    if endpoint is None or endpoint.provider != kind:
        log.warning("model endpoint %r is not configured for provider %r in this worker", name, kind)
        return RefusingProvider("EndpointNotConfigured", f"the model endpoint {name!r} is not configured")
    if not endpoint.allows(str(model.get("model") or "")):
        return RefusingProvider("ModelNotServed", f"the model endpoint {name!r} does not serve this model")
    return entry.build(endpoint, model, on_delta)


def endpoint_name(model: dict) -> str | None:
    """The endpoint an agent's `model` block sends its requests to (its
    `endpoint`, else its provider's default), or None for a provider that
    calls no operator-configured endpoint (`scripted`): what a tenant's
    `allowed_endpoints` is checked against."""
    entry = PROVIDERS.get(model.get("provider"))
    if entry is None or not entry.endpoint:
        return None
    name = model.get("endpoint") or entry.default_endpoint
    return name if isinstance(name, str) else None


def provider_streams(model: dict) -> bool:
    """Whether the block's provider streams text deltas (the executor then
    attaches the delta batcher)."""
    entry = PROVIDERS.get(model.get("provider"))
    return bool(entry and entry.streams)
