"""The `openai` provider: any OpenAI-compatible
chat-completions endpoint with tool calling — OpenAI, vLLM, Ollama,
llama.cpp server.

Agent block: `{"provider": "openai", "endpoint": "openai", "model":
"gpt-4o-mini"}`. The endpoint (base URL and the variable holding the key) is
operator configuration (`runs/providers/endpoints.py`,
`AGENTRT_MODEL_ENDPOINTS`); the adapter is built only from a configured
`Endpoint`, never from an agent's block. One `complete()` is one model
*attempt* (three retry loops, three owners):

* It POSTs `{base_url}/chat/completions` with `stream: true` and
  `stream_options.include_usage`, and accumulates text and tool-call deltas
  (by `index`, arguments concatenated; raw argument text is passed through
  even when it is not JSON — the tool pipeline answers that to the model).
* Retries are the provider's only while nothing has been streamed
  (`stream_had_output` false): HTTP 408/409/429/5xx, connect errors, timeouts
  and a connection lost before the first delta; at most `max_tries` tries
  within `max_wait` seconds of waiting (the settings' AGENTRT_MODEL_RETRY_*:
  6 tries, 30 s), exponential backoff with jitter from an injectable RNG, `Retry-After`
  (or `retry-after-ms`) honoured, every sleep a `token.wait(delay)` so
  cancellation interrupts it. Once a text or tool-call delta has arrived, any
  failure is `ModelError(transient=True, stream_had_output=True)` and never
  retried here: the loop decides.
* 400/401/403/404/422 (and any other 4xx) are permanent.
* Garbage (non-JSON data, a chunk with neither `choices` nor `usage`, a body
  of the wrong type) is `MalformedResponse`, transient (the loop may retry
  the step; the provider does not retry it itself, since a server that speaks
  another protocol answers the same way again), with `stream_had_output` as
  it stands.
* The cancellation token is checked between chunks; a watchdog thread also
  shuts the socket down when the token is set (or the call outlives
  `max_call_seconds`), so a stalled stream is abandoned at once. Cancelled →
  `ModelTurn(stop_reason=cancelled)` with the usage known so far.
* The API key is read from `os.environ[endpoint.api_key_env]` at each call,
  sent as a Bearer header, never stored, logged or put in a message. Error
  messages are the adapter's own words: no provider text, no URL, no variable
  name (a missing key says which *endpoint* lacks one; the worker log names
  the variable). Every connection-level failure before output is one class,
  `ConnectionFailed`, with one message; the log has the detail.
* Usage: `prompt_tokens` → input (cache reads included), `completion_tokens`
  → output (reasoning included), `cached_tokens` → cache read,
  `reasoning_tokens`, cache creation where a compatible server reports it.
  A server that reports no usage gets a conservative estimate (≈ 4 characters
  a token) so budgets still bind. A failed attempt that had output (a cut
  stream, a mid-stream error, a timeout after output) carries its usage on
  the `ModelError`: what the server reported before the cut, else the same
  estimate over the whole prompt and the output received; the loop charges
  it. A failure before any output is not charged (nothing was generated).
  Cost comes from `prices.py`; an unpriced model is a permanent
  `ModelNotPriced` error, never free.

`tool_choice` "none": neither `tools` nor `tool_choice` is sent (the loop
already builds such requests with no tools, and OpenAI refuses a
`tool_choice` without `tools`). Otherwise "auto"/"required" pass through, and
any other value names a function to force.
"""

from typing import Literal

from pydantic import Field

from runs.providers import prices
from runs.providers.config import EndpointModel
from runs.providers.openai.client import OpenAIProvider
from runs.providers.registry import register_provider
from runs.providers.wire.retry import retry_policy


class OpenAIModel(EndpointModel):
    """`{"provider": "openai", "endpoint": "openai", "model": "gpt-4o-mini"}`."""

    provider: Literal["openai"]
    endpoint: str = Field("openai", min_length=1, max_length=100)


@register_provider(
    "openai",
    config=OpenAIModel,
    streams=True,
    endpoint=True,
    price_check=prices.require_price,
    base_url="https://api.openai.com/v1",
    api_key_env="OPENAI_API_KEY",
)
def build(endpoint, block: dict, on_delta=None) -> OpenAIProvider:
    return OpenAIProvider(endpoint, str(block.get("model") or ""), on_delta=on_delta, **retry_policy())


__all__ = ["OpenAIModel", "OpenAIProvider"]
