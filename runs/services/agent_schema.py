"""The agent definition (docs/agents.md), validated strictly (unknown keys refused)."""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic.fields import FieldInfo

from approvals.policy import DECISIONS, OPS
from runs.domain.limits import BY_NAME
from runs.domain.values import RunLimits
from runs.errors import InvalidInput
from runs.providers import PROVIDERS
from runs.providers.anthropic import AnthropicModel  # noqa: F401  (public: the built-in blocks)
from runs.providers.config import EndpointModel, Strict  # noqa: F401
from runs.providers.openai import OpenAIModel  # noqa: F401
from runs.providers.prices import check_model_priced
from runs.providers.scripted import ScriptedModel  # noqa: F401
from runs.tools import REGISTRY

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


def _optional(name: str) -> Any:
    """A definition's field for one limit: optional, within the table's lower bound
    and the most a definition may ask for."""
    return Field(None, **BY_NAME[name].bounds(upper=True))


class Limits(Strict):
    """An agent definition's `limits`: every key of the limits table (runs/domain/limits.py),
    each optional (tests/unit/test_limits.py checks the fields are exactly the table's)."""

    max_steps: int | None = _optional("max_steps")
    max_model_calls: int | None = _optional("max_model_calls")
    max_tool_calls: int | None = _optional("max_tool_calls")
    max_input_tokens: int | None = _optional("max_input_tokens")
    max_output_tokens: int | None = _optional("max_output_tokens")
    max_cost_usd: float | None = _optional("max_cost_usd")
    deadline_seconds: float | None = _optional("deadline_seconds")
    synthesis_reserve_steps: int | None = _optional("synthesis_reserve_steps")
    synthesis_reserve_model_calls: int | None = _optional("synthesis_reserve_model_calls")
    synthesis_reserve_tool_calls: int | None = _optional("synthesis_reserve_tool_calls")
    synthesis_reserve_cost_usd: float | None = _optional("synthesis_reserve_cost_usd")

    def given(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


AGENT_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"
DELEGATE_TOOL = "delegate_run"


class AgentDefinition(Strict):
    name: str = Field(min_length=1, max_length=100, pattern=AGENT_NAME)
    instructions: str = Field("", max_length=100_000)
    # One member per registered provider (runs.providers.registry): rebuilt when one registers.
    model: ScriptedModel | OpenAIModel | AnthropicModel = Field(discriminator="provider")
    tools: list[str] = Field(default_factory=list, max_length=100)
    policy: Policy = Field(default_factory=Policy)
    limits: Limits = Field(default_factory=Limits)
    # The agents a delegating tool (`delegate_run`) may start as child runs, by name, in this tenant.
    delegates: list[Annotated[str, Field(min_length=1, max_length=100, pattern=AGENT_NAME)]] = Field(
        default_factory=list, max_length=50, validate_default=True
    )

    @field_validator("model")
    @classmethod
    def _priced(cls, model):
        """The block's provider's own price check (its registry entry): a
        model with no price is never counted as free. A refusal names the
        `model` field."""
        check_model_priced(model)
        return model

    @field_validator("delegates")
    @classmethod
    def _delegates(cls, delegates, info: ValidationInfo):
        """`delegates` and a delegating tool (`control="delegate"`, e.g.
        `delegate_run`) come together: either one alone is a mistake."""
        if len(set(delegates)) != len(delegates):
            raise ValueError("delegates are listed more than once")
        tools = info.data.get("tools")
        if tools is None:  # the tools themselves were refused: that error says enough
            return delegates
        delegating = [t for t in tools if (spec := REGISTRY.spec(t)) is not None and spec.control == "delegate"]
        if delegates and not delegating:
            raise ValueError(
                f'delegates needs {DELEGATE_TOOL!r} in tools (or another tool registered with control="delegate")'
            )
        if not delegates and delegating:
            raise ValueError(f"{delegating[0]!r} in tools needs the agents it may start listed here")
        return delegates

    def normal(self) -> dict[str, Any]:
        """The canonical JSON whose hash is the version; `delegates` appears only
        when set, so the versions of definitions without it stay what they were."""
        out = self.model_dump(mode="json", exclude_none=False)
        out["policy"] = self.policy.normal()
        out["limits"] = self.limits.given()
        if not self.delegates:
            out.pop("delegates")
        return out

    @field_validator("tools")
    @classmethod
    def _tools(cls, tools):
        unknown = [t for t in tools if REGISTRY.spec(t) is None]
        if unknown:
            raise ValueError(f"unknown tools: {', '.join(unknown)} (registered: {', '.join(REGISTRY.names())})")
        if len(set(tools)) != len(tools):
            raise ValueError("tools are listed more than once")
        return tools


def model_block() -> Any:
    """The type of the `model` block: the tagged union of every registered provider's config."""
    configs = PROVIDERS.configs()
    if len(configs) == 1:
        return configs[0]
    return Annotated[Union[tuple(configs)], Field(discriminator="provider")]  # noqa: UP007


def _rebuild_model_block() -> None:
    fields = AgentDefinition.__pydantic_fields__
    current = set(getattr(fields["model"].annotation, "__args__", ()) or ())
    if current == set(PROVIDERS.configs()):
        return
    fields["model"] = FieldInfo.from_annotation(model_block())
    AgentDefinition.model_rebuild(force=True)


_rebuild_model_block()
PROVIDERS.on_change(_rebuild_model_block)


def resolve_limits(defaults: dict[str, Any], agent: dict[str, Any], requested: dict[str, Any] | None) -> RunLimits:
    """Defaults, then the agent's limits, then the request's, which may only tighten."""
    merged = {k: v for k, v in defaults.items() if v is not None}
    merged.update(agent)
    for key, value in (requested or {}).items():
        current = merged.get(key)
        if current is not None and value is not None and value > current:
            raise InvalidInput(
                f"limits.{key} may only tighten the agent's limit ({current})",
                fields={f"limits.{key}": [f"must be at most {current}"]},
            )
        merged[key] = value
    return RunLimits(**merged)
