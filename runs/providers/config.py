"""Config models of the agent's `model` block: the strict base
every provider's block uses, and the base of an endpoint provider's block
(`endpoint`, `model`, `context_window`), which checks the endpoint is
configured by the operator for this provider and serves the model."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from runs.providers.endpoints import configured, endpoint_for


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class EndpointModel(Strict):
    """A block that names an operator-configured endpoint. A subclass narrows
    `provider` to its `Literal[...]` and may change the defaults."""

    provider: str
    endpoint: str = Field("openai", min_length=1, max_length=100)
    model: str = Field(min_length=1, max_length=200)
    context_window: int | None = Field(128_000, ge=256, le=10_000_000)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, name, info):

        endpoint = configured().get(name)
        if endpoint is None:
            raise ValueError(f"no model endpoint named {name!r} is configured (endpoints are set by the operator)")
        provider = info.data.get("provider")
        if provider is not None and endpoint.provider != provider:
            raise ValueError(f"endpoint {name!r} serves provider {endpoint.provider!r}, not {provider!r}")
        return name

    @field_validator("model")
    @classmethod
    def _model(cls, model, info):

        name = info.data.get("endpoint")
        endpoint = endpoint_for(name) if name else None
        if endpoint is not None and not endpoint.allows(model):
            raise ValueError(f"endpoint {name!r} serves only: {', '.join(endpoint.models or ())}")
        return model
