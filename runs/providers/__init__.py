"""Model providers: adapters of the ModelProvider port, registered by
declaration (`runs.providers.registry`). The built-in ones register here:
`scripted`, `openai`, `anthropic`."""

from __future__ import annotations

from runs.providers import anthropic, openai, scripted  # noqa: F401  (register the built-in providers)
from runs.providers.registry import (  # noqa: F401  (public)
    PROVIDERS,
    RefusingProvider,
    endpoint_name,
    provider_for,
    provider_streams,
    register_provider,
)
from runs.providers.scripted import ScriptedProvider  # noqa: F401
