"""The price table: settings override, validation, snapshots, cost arithmetic."""

from __future__ import annotations

import pytest

from runs.providers import prices
from runs.providers.prices import check_model_priced, price_for


def test_default_table_prices_known_openai_models(settings):
    if hasattr(settings, "AGENTRT_MODEL_PRICES"):
        del settings.AGENTRT_MODEL_PRICES
    price = check_model_priced({"provider": "openai", "model": "gpt-4o-mini"})
    assert price.input_per_mtok == 0.15 and price.output_per_mtok == 0.60


@pytest.mark.parametrize(
    "model, figures",
    [
        ("claude-sonnet-4-5", (3.00, 15.00, 0.30, 3.75)),
        ("claude-opus-4-1", (15.00, 75.00, 1.50, 18.75)),
        ("claude-haiku-4-5", (1.00, 5.00, 0.10, 1.25)),
        ("claude-3-5-haiku", (0.80, 4.00, 0.08, 1.00)),
        # dated snapshots take the price of their undated name
        ("claude-sonnet-4-20250514", (3.00, 15.00, 0.30, 3.75)),
        ("claude-sonnet-4-5-20250929", (3.00, 15.00, 0.30, 3.75)),
        ("claude-3-5-haiku-20241022", (0.80, 4.00, 0.08, 1.00)),
    ],
)
def test_default_table_prices_anthropic_models_with_their_cache_rates(settings, model, figures):
    if hasattr(settings, "AGENTRT_MODEL_PRICES"):
        del settings.AGENTRT_MODEL_PRICES
    price = check_model_priced({"provider": "anthropic", "model": model})
    got = (price.input_per_mtok, price.output_per_mtok, price.cache_read_per_mtok, price.cache_creation_per_mtok)
    assert got == pytest.approx(figures)


def test_an_unknown_claude_model_is_not_priced_by_the_default_table(settings):
    if hasattr(settings, "AGENTRT_MODEL_PRICES"):
        del settings.AGENTRT_MODEL_PRICES
    with pytest.raises(ValueError, match="'claude-unreleased-9' has no price"):
        check_model_priced({"provider": "anthropic", "model": "claude-unreleased-9"})
    assert price_for("claude-sonnet-4-latest") is None  # only a date suffix falls back


def test_unpriced_model_is_refused_with_a_clear_message(settings):
    settings.AGENTRT_MODEL_PRICES = {"gpt-4o": {"input_per_mtok": 2.5, "output_per_mtok": 10}}
    with pytest.raises(ValueError) as info:
        check_model_priced({"provider": "openai", "model": "llama3.1:8b"})
    message = str(info.value)
    assert "'llama3.1:8b' has no price" in message and "AGENTRT_MODEL_PRICES" in message
    assert "never counted as free" in message


def test_settings_table_replaces_the_defaults(settings):
    settings.AGENTRT_MODEL_PRICES = {"llama3.1:8b": {"input_per_mtok": 0, "output_per_mtok": 0}}
    assert check_model_priced({"provider": "openai", "model": "llama3.1:8b"}).output_per_mtok == 0
    with pytest.raises(ValueError):
        check_model_priced({"provider": "openai", "model": "gpt-4o-mini"})


def test_other_providers_are_not_priced_here():
    assert check_model_priced({"provider": "scripted", "turns": []}) is None


def test_accepts_the_pydantic_model_block(settings):
    from runs.services.agent_schema import OpenAIModel

    settings.AGENTRT_MODEL_PRICES = {"m": {"input_per_mtok": 1, "output_per_mtok": 2}}
    block = OpenAIModel(provider="openai", model="m")
    assert check_model_priced(block).input_per_mtok == 1


@pytest.mark.parametrize(
    "entry, fragment",
    [
        ({"input_per_mtok": 1}, "lacks output_per_mtok"),
        ({"input_per_mtok": 1, "output_per_mtok": -1}, "non-negative"),
        ({"input_per_mtok": "1", "output_per_mtok": 1}, "non-negative number"),
        ({"input_per_mtok": True, "output_per_mtok": 1}, "non-negative number"),
        ({"input_per_mtok": 1, "output_per_mtok": 1, "input_per_mtoks": 1}, "unknown keys"),
        ("cheap", "must be an object"),
    ],
)
def test_invalid_entries_are_errors(settings, entry, fragment):
    settings.AGENTRT_MODEL_PRICES = {"m": entry}
    with pytest.raises(ValueError, match=fragment):
        check_model_priced({"provider": "openai", "model": "m"})


def test_dated_snapshot_takes_the_undated_price():
    table = {
        "gpt-4o": {"input_per_mtok": 2.5, "output_per_mtok": 10},
        "gpt-4o-mini": {"input_per_mtok": 0.15, "output_per_mtok": 0.6},
    }
    assert price_for("gpt-4o-mini-2024-07-18", table).input_per_mtok == 0.15
    assert price_for("gpt-4o-2024-08-06", table).input_per_mtok == 2.5
    assert price_for("gpt-4o-audio", table) is None  # only a date suffix falls back


def test_cost_charges_cached_tokens_at_the_cache_rate_and_missing_rates_at_input():
    price = prices.parse_price("m", {"input_per_mtok": 2.0, "output_per_mtok": 8.0, "cache_read_per_mtok": 0.5})
    # 1000 prompt tokens of which 400 cached; 100 completion tokens (reasoning included, not charged twice)
    cost = price.cost_usd(input_tokens=1000, output_tokens=100, cache_read_input_tokens=400, reasoning_tokens=60)
    assert cost == pytest.approx((600 * 2.0 + 400 * 0.5 + 100 * 8.0) / 1e6)
    no_cache_rate = prices.parse_price("m", {"input_per_mtok": 2.0, "output_per_mtok": 8.0})
    assert no_cache_rate.cache_read_per_mtok == 2.0 and no_cache_rate.cache_creation_per_mtok == 2.0
