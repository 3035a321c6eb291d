"""The `anthropic` provider: Anthropic's Messages API
(`POST {base_url}/messages`) on httpx, without the SDK and its retries.

Agent block: `{"provider": "anthropic", "endpoint": "anthropic", "model":
"claude-sonnet-4-5", "max_tokens": 4096}`. The endpoint (base URL, e.g.
`https://api.anthropic.com/v1`, and the variable holding the key) is operator
configuration (`AGENTRT_MODEL_ENDPOINTS` entry with `"provider":
"anthropic"`); the adapter is built only from a configured `Endpoint`. The key
goes in the `x-api-key` header, read from the environment at each call.

One `complete()` is one model attempt, on the same flow as the `openai`
provider (`runs.providers.wire.base`): retries only before output (408, 409,
429, 5xx and Anthropic's 529 `overloaded_error`, connection failures, an
`error` event before any delta), `Retry-After` honoured, at most `max_tries`;
after output any failure is `ModelError(transient=True,
stream_had_output=True)` for the loop to decide.

* Streaming: `text_delta` events are text (and `on_delta`); a `tool_use`
  block's `input_json_delta` pieces are its arguments (parallel tool calls
  are blocks at different indexes); `message_stop` ends the turn; `ping`,
  `thinking` and `signature` deltas are ignored.
* Usage: Anthropic's `input_tokens` excludes the cache, so our
  `input_tokens` is input + cache read + cache creation (the convention of
  `prices.py`), with `cache_read_input_tokens` and
  `cache_creation_input_tokens` as reported; `output_tokens` as reported.
* Stop reasons: `tool_use` → tool_calls, `max_tokens` → max_tokens,
  `end_turn` / `stop_sequence` / `pause_turn` → end_turn, `refusal` → a
  permanent `ModelRefused` error (asking again gets the same answer) that
  carries what the attempt spent.
* Requests: the instructions (and any `system` entry of the conversation)
  are the top-level `system`; tool results of one turn go back as
  `tool_result` blocks of one user message; `tool_choice` "none" sends no
  tools, "required" is `{"type": "any"}`, a name forces that tool.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from runs.providers import prices
from runs.providers.anthropic.client import AnthropicProvider
from runs.providers.config import EndpointModel
from runs.providers.registry import register_provider
from runs.providers.wire.retry import retry_policy


class AnthropicModel(EndpointModel):
    """`{"provider": "anthropic", "endpoint": "anthropic", "model": "claude-sonnet-4-5"}`."""

    provider: Literal["anthropic"]
    endpoint: str = Field("anthropic", min_length=1, max_length=100)
    context_window: int | None = Field(200_000, ge=256, le=10_000_000)
    max_tokens: int = Field(4096, ge=1, le=128_000)


@register_provider(
    "anthropic",
    config=AnthropicModel,
    streams=True,
    endpoint=True,
    price_check=prices.require_price,
    base_url="https://api.anthropic.com/v1",
    api_key_env="ANTHROPIC_API_KEY",
)
def build(endpoint, block: dict, on_delta=None) -> AnthropicProvider:
    return AnthropicProvider(
        endpoint,
        str(block.get("model") or ""),
        max_tokens=int(block.get("max_tokens") or 4096),
        on_delta=on_delta,
        **retry_policy(),
    )


__all__ = ["AnthropicModel", "AnthropicProvider"]
