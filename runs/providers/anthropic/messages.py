"""Our conversation entries as Messages API `system` text and messages.

The conversation is OpenAI-shaped (user / assistant with `tool_calls` / tool
/ system entries). Anthropic has two roles: an assistant turn's tool calls
are `tool_use` blocks, tool results are `tool_result` blocks of the next user
message, and consecutive entries of one role are merged into one message.
"""

from __future__ import annotations

import json
from typing import Any


def tool_input(arguments: Any) -> dict[str, Any]:
    """A recorded call's arguments as the object `tool_use.input` must be
    (arguments that were not a JSON object were answered as invalid: `{}`)."""
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str) and arguments.strip():
        try:
            value = json.loads(arguments)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}
    return {}


def _text(content: Any) -> str:
    if content is None:
        return ""
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def translate(instructions: str | None, conversation: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """(`system`, `messages`) of a request."""
    system = [instructions] if instructions else []
    messages: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": list(blocks)})

    for message in conversation:
        role = message.get("role")
        content = message.get("content")
        if role == "system":
            system.append(_text(content))
        elif role == "assistant":
            blocks: list[dict[str, Any]] = []
            if _text(content):
                blocks.append({"type": "text", "text": _text(content)})
            for call in message.get("tool_calls") or []:
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call.get("id"),
                        "name": call.get("name"),
                        "input": tool_input(call.get("arguments")),
                    }
                )
            add("assistant", blocks)
        elif role == "tool":
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": message.get("tool_call_id"),
                "content": _text(content),
            }
            if message.get("is_error"):
                block["is_error"] = True
            add("user", [block])
        elif _text(content):
            add("user", [{"type": "text", "text": _text(content)}])
    # The API refuses empty text blocks and a conversation that starts with the assistant.
    if not messages or messages[0]["role"] != "user":
        messages.insert(0, {"role": "user", "content": [{"type": "text", "text": "(no input)"}]})
    return "\n\n".join(s for s in system if s), messages
