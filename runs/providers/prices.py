"""Model prices, in USD per million tokens.

The table is `settings.AGENTRT_MODEL_PRICES` when that setting is defined
(it then *replaces* the built-in table, so an operator states every model they
use), else `DEFAULT_PRICES` below. An entry is

    {"input_per_mtok": 2.5, "output_per_mtok": 10.0,
     "cache_read_per_mtok": 1.25,         # optional, defaults to input_per_mtok
     "cache_creation_per_mtok": 3.125}    # optional, defaults to input_per_mtok

A model with no price is an error when the agent is loaded
(`check_model_priced`) and a permanent model error at call time: it is never
counted as free. A local model that really costs nothing is priced with
explicit zeros. A dated snapshot (`gpt-4o-2024-08-06`,
`claude-sonnet-4-20250514`) takes the price of its undated name when it has
none of its own.

Token accounting follows OpenAI's usage report: `input_tokens` is
`prompt_tokens` and *includes* the cache reads (and cache writes, where a
compatible server reports them); `output_tokens` is `completion_tokens` and
includes `reasoning_tokens`. The cost therefore charges the uncached part of
the prompt at the input rate, the cached part at the cache-read rate, the
cache writes at the cache-creation rate, and all completion tokens at the
output rate — reasoning tokens are not charged twice.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from runs.providers.registry import PROVIDERS


def _anthropic(input_per_mtok: float, output_per_mtok: float) -> dict[str, float]:
    return {
        "input_per_mtok": input_per_mtok,
        "output_per_mtok": output_per_mtok,
        "cache_read_per_mtok": round(input_per_mtok * 0.1, 6),
        "cache_creation_per_mtok": round(input_per_mtok * 1.25, 6),
    }


# OpenAI list prices (USD per 1M tokens, 2025). Verify against the provider's
# price page and override with AGENTRT_MODEL_PRICES; local models are not here
# on purpose (price them explicitly, even at zero).
DEFAULT_PRICES: dict[str, dict[str, float]] = {
    "gpt-4o": {"input_per_mtok": 2.50, "output_per_mtok": 10.00, "cache_read_per_mtok": 1.25},
    "gpt-4o-mini": {"input_per_mtok": 0.15, "output_per_mtok": 0.60, "cache_read_per_mtok": 0.075},
    "gpt-4.1": {"input_per_mtok": 2.00, "output_per_mtok": 8.00, "cache_read_per_mtok": 0.50},
    "gpt-4.1-mini": {"input_per_mtok": 0.40, "output_per_mtok": 1.60, "cache_read_per_mtok": 0.10},
    "gpt-4.1-nano": {"input_per_mtok": 0.10, "output_per_mtok": 0.40, "cache_read_per_mtok": 0.025},
    "o3-mini": {"input_per_mtok": 1.10, "output_per_mtok": 4.40, "cache_read_per_mtok": 0.55},
    "o4-mini": {"input_per_mtok": 1.10, "output_per_mtok": 4.40, "cache_read_per_mtok": 0.275},
    # Anthropic list prices (USD per 1M tokens, 2025): cache reads at 0.1x the
    # input rate, 5-minute cache writes at 1.25x. Snapshots such as
    # claude-sonnet-4-20250514 take the price of their undated name.
    "claude-opus-4-1": _anthropic(15.00, 75.00),
    "claude-opus-4": _anthropic(15.00, 75.00),
    "claude-sonnet-4-5": _anthropic(3.00, 15.00),
    "claude-sonnet-4": _anthropic(3.00, 15.00),
    "claude-3-7-sonnet": _anthropic(3.00, 15.00),
    "claude-haiku-4-5": _anthropic(1.00, 5.00),
    "claude-3-5-haiku": _anthropic(0.80, 4.00),
}

_KEYS = ("input_per_mtok", "output_per_mtok", "cache_read_per_mtok", "cache_creation_per_mtok")
_REQUIRED = ("input_per_mtok", "output_per_mtok")
_SNAPSHOT = re.compile(r"^(?P<base>.+)-(\d{4}-\d{2}-\d{2}|\d{8})$")  # gpt-4o-2024-08-06, claude-...-20250514


@dataclass(frozen=True)
class Price:
    input_per_mtok: float
    output_per_mtok: float
    cache_read_per_mtok: float
    cache_creation_per_mtok: float

    def cost_usd(
        self,
        *,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cache_read_input_tokens: int = 0,
        cache_creation_input_tokens: int = 0,
        **_: Any,
    ) -> float:
        """Cost of one call; `input_tokens` includes the cached tokens."""
        uncached = max(0, input_tokens - cache_read_input_tokens - cache_creation_input_tokens)
        total = (
            uncached * self.input_per_mtok
            + cache_read_input_tokens * self.cache_read_per_mtok
            + cache_creation_input_tokens * self.cache_creation_per_mtok
            + output_tokens * self.output_per_mtok
        ) / 1_000_000
        return round(total, 8)


def _number(model: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"the price of model {model!r}: {key} must be a non-negative number")
    return float(value)


def parse_price(model: str, entry: Any) -> Price:
    """Validate one table entry; raise ValueError naming the model and the key."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"the price of model {model!r} must be an object with {', '.join(_REQUIRED)}")
    unknown = sorted(set(entry) - set(_KEYS))
    if unknown:
        raise ValueError(f"the price of model {model!r} has unknown keys {unknown} (allowed: {', '.join(_KEYS)})")
    missing = [k for k in _REQUIRED if k not in entry]
    if missing:
        raise ValueError(f"the price of model {model!r} lacks {', '.join(missing)}")
    values = {k: _number(model, k, entry[k]) for k in _KEYS if k in entry}
    # An unstated cache rate is charged at the input rate: never free.
    values.setdefault("cache_read_per_mtok", values["input_per_mtok"])
    values.setdefault("cache_creation_per_mtok", values["input_per_mtok"])
    return Price(**values)


def price_table() -> Mapping[str, Any]:
    """`settings.AGENTRT_MODEL_PRICES` when defined (and not None), else the built-in table."""
    try:
        if settings.configured:
            table = getattr(settings, "AGENTRT_MODEL_PRICES", None)
            if table is not None:
                if not isinstance(table, Mapping):
                    raise ValueError("AGENTRT_MODEL_PRICES must be a dict of model name -> price")
                return table
    except ImportError:  # pragma: no cover - Django is always installed here
        pass
    return DEFAULT_PRICES


def price_for(model: str, table: Mapping[str, Any] | None = None) -> Price | None:
    """The validated price of `model` (or of its undated name), or None."""
    table = price_table() if table is None else table
    if model in table:
        return parse_price(model, table[model])
    match = _SNAPSHOT.match(model)
    if match and match.group("base") in table:
        return parse_price(model, table[match.group("base")])
    return None


def require_price(model_config: Any) -> Price:
    """The price check of a provider that is paid per token: the block's
    `model` must have a (valid) price, else ValueError."""
    if hasattr(model_config, "model_dump"):
        model_config = model_config.model_dump()
    provider = model_config.get("provider") if isinstance(model_config, Mapping) else None
    model = model_config.get("model") if isinstance(model_config, Mapping) else None
    if not isinstance(model, str) or not model:
        raise ValueError(f"the {provider} model block needs a model name")
    price = price_for(model)
    if price is None:
        raise ValueError(
            f"model {model!r} has no price: add it to AGENTRT_MODEL_PRICES "
            "(USD per million tokens: input_per_mtok, output_per_mtok, optional cache_read_per_mtok, "
            "cache_creation_per_mtok; explicit zeros for a free local model) — "
            "an unpriced model is never counted as free"
        )
    return price


def check_model_priced(model_config: Any) -> Price | None:
    """The agent-validation hook: the block's provider's price check (from
    its registry entry; `require_price` for a per-token provider). A
    provider without one is not priced here (None)."""

    raw = model_config.model_dump() if hasattr(model_config, "model_dump") else model_config
    entry = PROVIDERS.get(raw.get("provider") if isinstance(raw, Mapping) else None)
    if entry is None or entry.price_check is None:
        return None
    return entry.price_check(model_config)
