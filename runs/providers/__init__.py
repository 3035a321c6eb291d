"""Model providers: adapters of the ModelProvider port."""
from .scripted import ScriptedProvider


def provider_for(model: dict):
    """Return the provider an agent's `model` block names."""
    kind = model.get("provider")
    if kind == "scripted":
        return ScriptedProvider(model)
    raise ValueError(f"unknown model provider {kind!r}")
