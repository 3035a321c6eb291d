"""A local server that speaks Anthropic's Messages API, scripted per request.

It reuses the scripted HTTP server of fake_openai (the same `answer`, `hang`
and `stream` plans, recorded requests, cut and stall): what differs is the
protocol of the events, built here. A Messages stream is server-sent events
with an `event:` line naming the type and a `data:` line with the JSON (whose
`type` repeats it); it ends with `message_stop` and no `[DONE]`.
"""

from __future__ import annotations

import json
from typing import Any

from tests.providers.fake_openai import FakeOpenAI, answer, stream  # noqa: F401  (answer, hang re-exported)


class FakeAnthropic(FakeOpenAI):
    """The same scripted server; `base_url` is what an endpoint names (`.../v1`)."""


def sse(event: dict) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


def message_start(input_tokens: int = 10, *, cache_read: int = 0, cache_creation: int = 0) -> dict:
    return {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "m",
            "content": [],
            "stop_reason": None,
            "usage": {
                "input_tokens": input_tokens,
                "output_tokens": 1,
                "cache_read_input_tokens": cache_read,
                "cache_creation_input_tokens": cache_creation,
            },
        },
    }


def text_start(index: int) -> dict:
    return {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}


def text_delta(index: int, text: str) -> dict:
    return {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}


def tool_start(index: int, call_id: str, name: str) -> dict:
    return {
        "type": "content_block_start",
        "index": index,
        "content_block": {"type": "tool_use", "id": call_id, "name": name, "input": {}},
    }


def json_delta(index: int, piece: str) -> dict:
    return {"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": piece}}


def block_stop(index: int) -> dict:
    return {"type": "content_block_stop", "index": index}


def message_delta(stop_reason: str, output_tokens: int) -> dict:
    return {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": None},
        "usage": {"output_tokens": output_tokens},
    }


MESSAGE_STOP = {"type": "message_stop"}
PING = {"type": "ping"}


def events(*items: dict | str, **kwargs: Any) -> dict:
    """A Messages stream plan: each dict is sent as one SSE event."""
    return stream([sse(i) if isinstance(i, dict) else i for i in items], done=False, **kwargs)


def text_answer(*pieces: str, input_tokens: int = 10, output_tokens: int = 5, stop: str = "end_turn", **kwargs) -> dict:
    items: list[dict] = [message_start(input_tokens), text_start(0), PING]
    items += [text_delta(0, p) for p in pieces]
    items += [block_stop(0), message_delta(stop, output_tokens), MESSAGE_STOP]
    return events(*items, **kwargs)


def tool_answer(*calls: tuple[str, str, str], text: str | None = None, input_tokens: int = 20, output_tokens: int = 9):
    """Tool use, each call `(id, name, arguments JSON)` as its own block (parallel calls), its input in two pieces."""
    items: list[dict] = [message_start(input_tokens)]
    index = 0
    if text:
        items += [text_start(0), text_delta(0, text), block_stop(0)]
        index = 1
    for call_id, name, arguments in calls:
        half = len(arguments) // 2
        items += [tool_start(index, call_id, name), json_delta(index, arguments[:half])]
        items += [json_delta(index, arguments[half:]), block_stop(index)]
        index += 1
    items += [message_delta("tool_use", output_tokens), MESSAGE_STOP]
    return events(*items)


def error_body(kind: str, message: str = "error") -> dict:
    return {"type": "error", "error": {"type": kind, "message": message}}
