"""Model providers: adapters of the ModelProvider port."""

from __future__ import annotations

import logging

from runs.domain.errors import ModelError
from runs.domain.values import ModelTurn, StopReason
from runs.providers.scripted import ScriptedProvider

log = logging.getLogger("agentrt.providers")


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
    """Return the provider an agent's `model` block names.

    An `openai` block names an operator-configured endpoint; a block that
    carries its own `base_url` or `api_key_env` (an agent version stored
    before endpoints existed) is never honoured: the run fails
    `model_permanent_error` / `LegacyModelBlock` without a request being sent.
    """
    kind = model.get("provider")
    if kind == "scripted":
        return ScriptedProvider(model)
    if kind == "openai":
        from runs.providers.endpoints import DEFAULT_ENDPOINT, endpoint_for
        from runs.providers.openai import OpenAIProvider

        if "base_url" in model or "api_key_env" in model:
            log.warning(
                "refusing a stored model block with base_url/api_key_env (publish a version that names an endpoint)"
            )
            return RefusingProvider(
                "LegacyModelBlock",
                "this agent version names its own model server (base_url/api_key_env), which is no longer honoured; "
                "publish a new version whose model block names an endpoint",
            )
        name = model.get("endpoint") or DEFAULT_ENDPOINT
        endpoint = endpoint_for(name) if isinstance(name, str) else None
        if endpoint is None or endpoint.provider != kind:
            log.warning("model endpoint %r is not configured for provider %r in this worker", name, kind)
            return RefusingProvider("EndpointNotConfigured", f"the model endpoint {name!r} is not configured")
        if not endpoint.allows(str(model.get("model") or "")):
            return RefusingProvider("ModelNotServed", f"the model endpoint {name!r} does not serve this model")
        return OpenAIProvider(endpoint, str(model.get("model") or ""), on_delta=on_delta)
    raise ValueError(f"unknown model provider {kind!r}")
