"""The agent definition of DESIGN §16, validated strictly (unknown keys refused)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from approvals.policy import DECISIONS, OPS
from runs.domain.values import RunLimits


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ScriptedModel(Strict):
    provider: Literal["scripted"]
    context_window: int | None = Field(None, ge=256, le=10_000_000)
    turns: list[dict[str, Any]] = Field(default_factory=list, max_length=10000)

    @field_validator("turns")
    @classmethod
    def _turns(cls, turns):
        allowed = {
            "text",
            "tool_calls",
            "delay_ms",
            "usage",
            "empty",
            "error",
            "attempts",
            "stop_reason",
            "stream_had_output",
        }
        for i, turn in enumerate(turns):
            if not isinstance(turn, dict):
                raise ValueError(f"turn {i} must be an object")
            unknown = set(turn) - allowed
            if unknown:
                raise ValueError(f"turn {i} has unknown keys: {sorted(unknown)}")
            if "error" in turn and turn["error"] not in ("transient", "permanent"):
                raise ValueError(f"turn {i}: error must be 'transient' or 'permanent'")
            if "delay_ms" in turn and (not isinstance(turn["delay_ms"], (int, float)) or turn["delay_ms"] < 0):
                raise ValueError(f"turn {i}: delay_ms must be a non-negative number")
            for call in turn.get("tool_calls") or []:
                if not isinstance(call, dict) or "name" not in call:
                    raise ValueError(f"turn {i}: every tool call needs a name")
            for sub in turn.get("attempts") or []:
                if not isinstance(sub, dict):
                    raise ValueError(f"turn {i}: attempts must be objects")
        return turns


# Keys by which a definition could choose where a request goes or which
# secret it carries. Endpoints are operator configuration
# (AGENTRT_MODEL_ENDPOINTS); a definition carrying one of these is refused.
FORBIDDEN_MODEL_KEYS = ("base_url", "api_key_env")
FORBIDDEN_MESSAGE = (
    "not allowed in an agent definition: model endpoints are operator configuration "
    "(AGENTRT_MODEL_ENDPOINTS); name one with model.endpoint"
)


def forbidden_model_keys(definition: Any) -> dict[str, list[str]]:
    """`{"model.<path>": [message]}` for every base_url / api_key_env anywhere in the model block."""
    found: dict[str, list[str]] = {}

    def walk(value: Any, path: str, depth: int) -> None:
        if depth > 32:
            return
        if isinstance(value, dict):
            for key, sub in value.items():
                where = f"{path}.{key}"
                if key in FORBIDDEN_MODEL_KEYS:
                    found[where] = [FORBIDDEN_MESSAGE]
                walk(sub, where, depth + 1)
        elif isinstance(value, list):
            for i, sub in enumerate(value):
                walk(sub, f"{path}.{i}", depth + 1)

    if isinstance(definition, dict):
        walk(definition.get("model"), "model", 0)
    return found


class OpenAIModel(Strict):
    provider: Literal["openai"]
    endpoint: str = Field("openai", min_length=1, max_length=100)
    model: str = Field(min_length=1, max_length=200)
    context_window: int | None = Field(128_000, ge=256, le=10_000_000)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, name, info):
        from runs.providers.endpoints import configured

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
        from runs.providers.endpoints import endpoint_for

        name = info.data.get("endpoint")
        endpoint = endpoint_for(name) if name else None
        if endpoint is not None and not endpoint.allows(model):
            raise ValueError(f"endpoint {name!r} serves only: {', '.join(endpoint.models)}")
        return model


class When(Strict):
    arg: str = Field(min_length=1, max_length=200)
    op: str
    value: Any = None

    @field_validator("op")
    @classmethod
    def _op(cls, op):
        if op not in OPS:
            raise ValueError(f"op must be one of {', '.join(OPS)}")
        return op

    @model_validator(mode="after")
    def _value(self):
        if self.op == "in" and not isinstance(self.value, list):
            raise ValueError("'in' needs a list value")
        if self.op in ("gt", "gte", "lt", "lte") and (
            isinstance(self.value, bool) or not isinstance(self.value, (int, float))
        ):
            raise ValueError(f"'{self.op}' needs a number value")
        return self


class Rule(Strict):
    tool: str = Field(min_length=1, max_length=100)
    decision: str
    when: When | None = None
    # true: the rule matches only calls of tools with a side effect (not read-only);
    # false: only read-only tools; absent: either. Lets a tenant floor say
    # `{"tool": "*", "side_effect": true, "decision": "require_approval"}`.
    side_effect: bool | None = None

    @field_validator("decision")
    @classmethod
    def _decision(cls, d):
        if d not in DECISIONS:
            raise ValueError(f"decision must be one of {', '.join(DECISIONS)}")
        return d


class Policy(Strict):
    default: str = "allow"
    rules: list[Rule] = Field(default_factory=list, max_length=200)

    def normal(self) -> dict[str, Any]:
        """The canonical JSON (an absent `side_effect` stays absent, so hashes of older definitions hold)."""
        out = self.model_dump(mode="json")
        for rule in out["rules"]:
            if rule.get("side_effect") is None:
                rule.pop("side_effect", None)
        return out

    @field_validator("default")
    @classmethod
    def _default(cls, d):
        if d not in DECISIONS:
            raise ValueError(f"default must be one of {', '.join(DECISIONS)}")
        return d


class Limits(Strict):
    max_steps: int | None = Field(None, ge=1, le=10000)
    max_model_calls: int | None = Field(None, ge=1, le=10000)
    max_tool_calls: int | None = Field(None, ge=0, le=100000)
    max_input_tokens: int | None = Field(None, ge=1)
    max_output_tokens: int | None = Field(None, ge=1)
    max_cost_usd: float | None = Field(None, ge=0)
    deadline_seconds: float | None = Field(None, gt=0, le=30 * 86400)
    synthesis_reserve_steps: int | None = Field(None, ge=0)
    synthesis_reserve_model_calls: int | None = Field(None, ge=0)
    synthesis_reserve_tool_calls: int | None = Field(None, ge=0)
    synthesis_reserve_cost_usd: float | None = Field(None, ge=0)

    def given(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class AgentDefinition(Strict):
    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    instructions: str = Field("", max_length=100_000)
    model: ScriptedModel | OpenAIModel = Field(discriminator="provider")
    tools: list[str] = Field(default_factory=list, max_length=100)
    policy: Policy = Field(default_factory=Policy)
    limits: Limits = Field(default_factory=Limits)

    @model_validator(mode="after")
    def _priced(self):
        from runs.providers.prices import check_model_priced

        check_model_priced(self.model)  # a model with no price is never counted as free
        return self

    @field_validator("tools")
    @classmethod
    def _tools(cls, tools):
        from runs.tools import REGISTRY

        unknown = [t for t in tools if REGISTRY.spec(t) is None]
        if unknown:
            raise ValueError(f"unknown tools: {', '.join(unknown)} (registered: {', '.join(REGISTRY.names())})")
        if len(set(tools)) != len(tools):
            raise ValueError("tools are listed more than once")
        return tools


def resolve_limits(defaults: dict[str, Any], agent: dict[str, Any], requested: dict[str, Any] | None) -> RunLimits:
    """Defaults, then the agent's limits, then the request's, which may only tighten."""
    merged = {k: v for k, v in defaults.items() if v is not None}
    merged.update(agent)
    for key, value in (requested or {}).items():
        current = merged.get(key)
        if current is not None and value is not None and value > current:
            from runs.errors import InvalidInput

            raise InvalidInput(
                f"limits.{key} may only tighten the agent's limit ({current})",
                fields={f"limits.{key}": [f"must be at most {current}"]},
            )
        merged[key] = value
    return RunLimits(**merged)
