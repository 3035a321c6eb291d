"""Model providers: adapters of the ModelProvider port."""
from .scripted import ScriptedProvider


def provider_for(model: dict, on_delta=None):
    """Return the provider an agent's `model` block names."""
    kind = model.get("provider")
    if kind == "scripted":
        return ScriptedProvider(model)
    if kind == "openai":
        from .openai import OpenAIProvider

        return OpenAIProvider(model, on_delta=on_delta)
    raise ValueError(f"unknown model provider {kind!r}")
