"""Reading a chat-completions answer: the event stream (one chunk per `data:`
line, tool-call deltas accumulated by `index`) or a whole JSON answer from a
server that ignored `stream`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx

from runs.domain.errors import ModelError
from runs.providers.wire.retry import Retry
from runs.providers.wire.turn import Turn


class ChatCompletionsReader:
    """Mixin of `OpenAIProvider`: `on_event` and `read_json` fill a `Turn`."""

    # provided by the provider base class (runs/providers/wire/base.py)
    _malformed: Callable[[Turn, str], ModelError]
    _emit: Callable[[str], None]

    def on_event(self, data: str, turn: Turn) -> None:  # noqa: C901 - one branch per streamed chunk kind
        if data.strip() == "[DONE]":
            turn.done = True
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            raise self._malformed(turn, "data that is not JSON") from None
        if not isinstance(chunk, dict):
            raise self._malformed(turn, "a chunk that is not an object")
        if chunk.get("error"):
            if turn.had_output:
                raise ModelError(
                    "ProviderStreamError",
                    "the model server reported an error mid-stream",
                    transient=True,
                    stream_had_output=True,
                )
            raise Retry("ProviderStreamError", "the model server reported an error in the stream")
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            turn.usage = usage
        choices = chunk.get("choices")
        if choices is None:
            if isinstance(usage, dict):
                return  # the usage chunk
            raise self._malformed(turn, "a chunk without choices")
        if not isinstance(choices, list):
            raise self._malformed(turn, "choices that are not a list")
        for choice in choices:
            if not isinstance(choice, dict):
                raise self._malformed(turn, "a choice that is not an object")
            position = choice.get("index")
            if isinstance(position, int) and not isinstance(position, bool) and position != 0:
                continue  # n=1 is asked for; ignore any other choice
            delta = choice.get("delta")
            if delta is None:
                delta = choice.get("message") or {}
            try:
                self._delta(delta, turn)
            except ValueError:
                raise self._malformed(turn, "a delta of the wrong shape") from None
            finish = choice.get("finish_reason")
            if isinstance(finish, str) and finish:
                turn.finish_reason = finish

    def _delta(self, delta: Any, turn: Turn) -> None:
        if not isinstance(delta, dict):
            raise ValueError("delta")
        content = delta.get("content")
        if content is not None and not isinstance(content, str):
            raise ValueError("content")
        if content:
            turn.text.append(content)
            turn.had_output = True
            self._emit(content)
        calls = delta.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise ValueError("tool_calls")
            for call in calls:
                turn.add_call_delta(call)

    def read_json(self, response: httpx.Response, turn: Turn) -> None:
        try:
            answer = json.loads(response.read())
        except ValueError:
            raise self._malformed(turn, "a body that is not JSON") from None
        if not isinstance(answer, dict):
            raise self._malformed(turn, "a body that is not an object")
        if answer.get("error"):
            raise Retry("ProviderStreamError", "the model server reported an error")
        choices = answer.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise self._malformed(turn, "an answer without choices")
        message = choices[0].get("message")
        if not isinstance(message, dict):
            raise self._malformed(turn, "an answer without a message")
        calls = message.get("tool_calls")
        if isinstance(calls, list):  # whole calls: give them positions for the accumulator
            message = dict(
                message, tool_calls=[dict(c, index=i) if isinstance(c, dict) else c for i, c in enumerate(calls)]
            )
        try:
            self._delta(message, turn)
        except ValueError:
            raise self._malformed(turn, "a message of the wrong shape") from None
        turn.finish_reason = choices[0].get("finish_reason") or "stop"
        if isinstance(answer.get("usage"), dict):
            turn.usage = answer["usage"]
        turn.done = True
