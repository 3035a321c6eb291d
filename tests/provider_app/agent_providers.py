"""The `tape` provider: it plays back a fixed text, streaming it in pieces
through the `on_delta` it is given, and is priced by its own price list
(not the per-token table of `runs.providers.prices`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from runs.domain.values import ModelTurn, ModelUsage, StopReason
from runs.providers import register_provider
from runs.providers.config import Strict
from runs.providers.prices import Price

PRICE_LIST = {
    "tape-small": Price(input_per_mtok=1, output_per_mtok=2, cache_read_per_mtok=1, cache_creation_per_mtok=1)
}
PRICE_CHECKS: list[str] = []  # every model the price check was asked about, in order
BUILT_WITH: list[Any] = []  # the `on_delta` each adapter was built with


class TapeModel(Strict):
    provider: Literal["tape"]
    model: str = Field(min_length=1)
    text: str = Field("played back", min_length=1)
    pieces: int = Field(1, ge=1, le=10)
    context_window: int | None = Field(8_000, ge=256)


def tape_price(block: Any) -> Price:
    model = block.model if isinstance(block, TapeModel) else block["model"]
    PRICE_CHECKS.append(model)
    if model not in PRICE_LIST:
        raise ValueError(f"model {model!r} is not on the tape price list ({', '.join(PRICE_LIST)})")
    return PRICE_LIST[model]


class TapeProvider:
    def __init__(self, block: dict, on_delta):
        self.text = str(block.get("text") or "")
        self.pieces = int(block.get("pieces") or 1)
        self.on_delta = on_delta

    def complete(self, request, token) -> ModelTurn:
        if self.on_delta is not None:
            size = -(-len(self.text) // self.pieces)
            for start in range(0, len(self.text), size):
                self.on_delta(self.text[start : start + size])
        return ModelTurn(
            text=self.text, stop_reason=StopReason.END_TURN, usage=ModelUsage(input_tokens=3, output_tokens=2)
        )


@register_provider("tape", config=TapeModel, streams=True, price_check=tape_price)
def build(block: dict, on_delta=None) -> TapeProvider:
    BUILT_WITH.append(on_delta)
    return TapeProvider(block, on_delta)
