"""Built-in tools: echo, http_get, http_post, sleep.

HTTP tools reach only hosts listed in AGENTRT_HTTP_TOOL_ALLOWED_HOSTS
(`host` or `host:port`), never follow redirects, and `http_post` sends the
invocation's idempotency key as the `Idempotency-Key` header.
"""
from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from django.conf import settings

from runs.domain.errors import ToolFailure

from .registry import register

MAX_BODY = 256 * 1024


@register(
    name="echo",
    description="Return the given text unchanged.",
    parameters={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"], "additionalProperties": False},
    read_only=True,
)
def echo(arguments, context):
    return arguments["text"]


# A member's agent cannot hold a worker longer than the operator allows:
# AGENTRT_MAX_SLEEP_SECONDS bounds the schema (what the model is told) and is
# checked again at call time (the setting may have been lowered since start).
MAX_SLEEP_SECONDS = settings.AGENTRT_MAX_SLEEP_SECONDS


@register(
    name="sleep",
    description="Wait for a number of seconds; stops early if the run is cancelled.",
    parameters={
        "type": "object",
        "properties": {"seconds": {"type": "number", "minimum": 0, "maximum": MAX_SLEEP_SECONDS}},
        "required": ["seconds"],
        "additionalProperties": False,
    },
    read_only=True,
    timeout_seconds=MAX_SLEEP_SECONDS + 30,
)
def sleep(arguments, context):
    limit = settings.AGENTRT_MAX_SLEEP_SECONDS
    if float(arguments["seconds"]) > limit:
        raise ToolFailure("invalid_arguments", f"seconds: at most {limit:g} (AGENTRT_MAX_SLEEP_SECONDS)")
    reason = context.token.wait(float(arguments["seconds"]))
    if reason is not None:
        raise ToolFailure("cancelled", f"sleep interrupted ({reason})")
    return {"slept": arguments["seconds"]}


def _check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ToolFailure("url_not_allowed", "only http and https URLs with a host are allowed")
    allowed = settings.AGENTRT_HTTP_TOOL_ALLOWED_HOSTS
    host = parts.hostname
    hostport = f"{host}:{parts.port}" if parts.port else host
    if host not in allowed and hostport not in allowed:
        raise ToolFailure("host_not_allowed", f"host {hostport!r} is not in AGENTRT_HTTP_TOOL_ALLOWED_HOSTS")
    return url


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def _request(req: urllib.request.Request, timeout: float, side_effect: bool):
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read(MAX_BODY)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", "") if exc.headers else "", exc.read(MAX_BODY) if exc.fp else b""
    except (socket.timeout, TimeoutError) as exc:
        raise ToolFailure("timeout", "the request timed out; whether it took effect is unknown" if side_effect else "the request timed out", uncertain=side_effect) from exc
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, (socket.timeout, TimeoutError)):
            raise ToolFailure("timeout", "the request timed out", uncertain=side_effect) from exc
        raise ToolFailure("connection_failed", f"could not connect: {type(reason).__name__}") from exc
    except OSError as exc:
        raise ToolFailure("connection_failed", f"the request failed: {type(exc).__name__}", uncertain=side_effect) from exc


def _decode(status, ctype, body: bytes):
    text = body.decode("utf-8", "replace")
    if "json" in ctype:
        try:
            return {"status": status, "json": json.loads(text)}
        except ValueError:
            pass
    return {"status": status, "text": text}


@register(
    name="http_get",
    description="GET a URL on an allowed host and return status and body.",
    parameters={
        "type": "object",
        "properties": {"url": {"type": "string", "maxLength": 2048}},
        "required": ["url"],
        "additionalProperties": False,
    },
    read_only=True,
    timeout_seconds=20,
)
def http_get(arguments, context):
    url = _check_url(arguments["url"])
    req = urllib.request.Request(url, method="GET", headers={"User-Agent": "agentrt"})
    return _decode(*_request(req, context.timeout_seconds, False))


@register(
    name="http_post",
    description="POST a JSON body to a URL on an allowed host (a side effect).",
    parameters={
        "type": "object",
        "properties": {"url": {"type": "string", "maxLength": 2048}, "json": {"type": "object"}},
        "required": ["url", "json"],
        "additionalProperties": False,
    },
    read_only=False,
    side_effect="external_write",
    timeout_seconds=20,
)
def http_post(arguments, context):
    url = _check_url(arguments["url"])
    body = json.dumps(arguments["json"]).encode()
    req = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Idempotency-Key": context.idempotency_key,
            "X-Agentrt-Attempt": str(context.attempt),
            "User-Agent": "agentrt",
        },
    )
    return _decode(*_request(req, context.timeout_seconds, True))


@register(
    name="ask_user",
    description="Ask the user a question; the run waits for the answer.",
    parameters={
        "type": "object",
        "properties": {"question": {"type": "string", "minLength": 1, "maxLength": 4000}},
        "required": ["question"],
        "additionalProperties": False,
    },
    read_only=True,
    control=True,
)
def ask_user(arguments, context):
    raise ToolFailure("control_tool", "ask_user is handled by the runtime, not executed")
