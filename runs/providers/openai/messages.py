"""Our conversation entries as chat-completions messages."""

from __future__ import annotations

import json
from typing import Any


def translate_message(message: dict[str, Any]) -> dict[str, Any]:
    role = message.get("role")
    content = message.get("content")
    if role == "assistant":
        out: dict[str, Any] = {"role": "assistant"}
        calls = [
            {
                "id": call.get("id"),
                "type": "function",
                "function": {"name": call.get("name"), "arguments": argument_text(call.get("arguments"))},
            }
            for call in message.get("tool_calls") or []
        ]
        if calls:
            out["content"] = content or None
            out["tool_calls"] = calls
        else:
            out["content"] = content or ""
        return out
    if role == "tool":
        if not isinstance(content, str):
            content = json.dumps(content, ensure_ascii=False)
        return {"role": "tool", "tool_call_id": message.get("tool_call_id"), "content": content}
    return {"role": role or "user", "content": content if content is not None else ""}


def argument_text(arguments: Any) -> str:
    if isinstance(arguments, str):
        return arguments or "{}"
    if arguments is None:
        return "{}"
    return json.dumps(arguments, ensure_ascii=False)
