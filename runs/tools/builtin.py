"""Built-in tools: echo, http_get, http_post, sleep.

HTTP tools reach only hosts listed in AGENTRT_HTTP_TOOL_ALLOWED_HOSTS
(`host:port`, or `host` for ports 80 and 443) and only addresses runs.net
lets a request go to, never follow redirects (a 3xx is returned as the
answer), and `http_post` sends the invocation's idempotency key as the
`Idempotency-Key` header. Their timeouts are bounded by the run's deadline
when the call starts. `http_get` stops when the run is cancelled; `http_post`,
a side effect, never drops a request it has sent: its watermark is committed
first, and it runs to completion (or its own timeout) whatever the run's
cancellation says. `_request` says how each error is classified (failed
before the request left, uncertain after).
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import socket
import threading
from urllib.parse import urlsplit

from django.conf import settings

from runs import net
from runs.domain.errors import OutcomeUnknown, ToolFailure
from runs.errors import AddressRefused
from runs.tools.registry import register

MAX_BODY = 256 * 1024
RESOLVE_SHARE = 0.5  # of a call's timeout, at most, for resolving its host
# A call may ask for a shorter timeout than the tool's (never a longer one).
TIMEOUT_ARG = {"type": "number", "exclusiveMinimum": 0, "maximum": 20}


@register(
    name="echo",
    description="Return the given text unchanged.",
    parameters={
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    },
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
    """`url` if the allow-list admits its host and port (runs.net.listed: a
    bare `host` entry admits 80 and 443 only) and, for an IP literal, the
    address is one a request may go to at all; ToolFailure otherwise."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise ToolFailure("url_not_allowed", "the URL's port is not valid") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ToolFailure("url_not_allowed", "only http and https URLs with a host are allowed")
    host = parts.hostname
    port = port or net.default_port(parts.scheme)
    if not net.listed(host, port, settings.AGENTRT_HTTP_TOOL_ALLOWED_HOSTS):
        raise ToolFailure(
            "host_not_allowed",
            f"{net.shown(host, port)!r} is not in AGENTRT_HTTP_TOOL_ALLOWED_HOSTS "
            "(a bare host there admits ports 80 and 443 only)",
        )
    try:
        net.refuse_literal(host)
    except AddressRefused as exc:
        raise ToolFailure("address_not_allowed", f"{exc}; the request was not sent") from exc
    return url


def _limit(arguments, context) -> float:
    """The call's socket timeout: the tool's timeout, the call's own
    `timeout_seconds` if smaller, bounded by what is left of the run's
    deadline. Nothing is sent once the deadline has passed."""
    limit = context.time_budget() if hasattr(context, "time_budget") else context.timeout_seconds
    asked = arguments.get("timeout_seconds")
    if isinstance(asked, (int, float)) and not isinstance(asked, bool):
        limit = min(limit, float(asked))
    if limit <= 0:
        raise ToolFailure("deadline_exceeded", "the run's deadline has passed; the request was not sent")
    return limit


@contextlib.contextmanager
def _abort_on_cancel(signal, conn):
    """Shut the connection's socket down when `signal` (a read-only request's
    cancellation; None for a side effect) is set while the request is in
    flight, so a blocked send or read stops at once."""
    done = threading.Event()

    def watch(signal):
        while not done.is_set():
            if signal.wait(0.1):
                sock = conn.sock
                if sock is not None and not done.is_set():
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return

    watcher = (
        threading.Thread(target=watch, args=(signal,), name="http-tool-cancel", daemon=True)
        if signal is not None
        else None
    )
    if watcher is not None:
        watcher.start()
    try:
        yield
    finally:
        done.set()


def _request(
    method: str, url: str, headers: dict, body: bytes | None, timeout: float, context, *, abandon_on_cancel: bool
):
    """One HTTP exchange, classified by where an error happened (README
    "Tool outcomes"):

    - before anything is sent (bad URL, deadline passed, already cancelled,
      DNS failure, connection refused or timed out, TLS handshake): `failed`,
      a `ToolFailure` — the request never left;
    - once the request is being sent (reset, closed before the answer, read
      timeout, cancellation): `uncertain`, an `OutcomeUnknown` — the server
      may have acted on it;
    - any HTTP status, 4xx and 5xx included, is an answer: the call
      succeeded and its result carries the status for the model to judge.

    `abandon_on_cancel` (a read-only request): a cancelled run refuses to
    send it and shuts its socket while it is in flight. A side effect passes
    False: its watermark is already committed when it gets here, so it is
    sent and its answer awaited whatever the run's cancellation or deadline
    says (bounded by `timeout`); "the run was cancelled" is no reason to
    lose whether the effect happened.
    """
    signal = getattr(context, "cancelled", None) if abandon_on_cancel else None
    if signal is not None and signal.is_set():
        raise ToolFailure("cancelled", "the run was cancelled; the request was not sent")
    parts = urlsplit(url)
    conn_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    if not parts.hostname:  # _check_url refuses these; never let an empty host mean localhost
        raise ToolFailure("url_not_allowed", "only http and https URLs with a host are allowed")
    conn = conn_class(parts.hostname, parts.port, timeout=timeout)
    # The lookup gets at most half the call's time (runs.net): a name server that does not answer fails the
    # call as `dns_failed` — nothing sent — well before the runtime's own timeout would make it an unknown outcome.
    conn._create_connection = functools.partial(  # type: ignore[attr-defined]
        net.create_connection,
        resolve_for=timeout * RESOLVE_SHARE,
        internal_names=settings.AGENTRT_OUTBOUND_INTERNAL_NAMES,
    )
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        try:
            conn.connect()
        except socket.gaierror as exc:
            raise ToolFailure("dns_failed", f"could not resolve {parts.hostname!r}; the request was not sent") from exc
        except AddressRefused as exc:
            raise ToolFailure("address_not_allowed", f"{exc}; the request was not sent") from exc
        except TimeoutError as exc:
            raise ToolFailure("connect_timeout", "the connection timed out; the request was not sent") from exc
        except OSError as exc:
            raise ToolFailure(
                "connection_failed", f"could not connect ({type(exc).__name__}); the request was not sent"
            ) from exc
        with _abort_on_cancel(signal, conn):
            try:
                conn.request(method, target, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read(MAX_BODY)
                return resp.status, resp.getheader("Content-Type", "") or "", data
            except (OSError, http.client.HTTPException) as exc:
                if signal is not None and signal.is_set():
                    raise OutcomeUnknown(
                        "cancelled",
                        "the run was cancelled while the request was in flight; whether it took effect is unknown",
                    ) from exc
                if isinstance(exc, (socket.timeout, TimeoutError)):
                    raise OutcomeUnknown(
                        "timeout",
                        f"no answer within {timeout:.3g} s after the request was sent; "
                        "whether it took effect is unknown",
                    ) from exc
                raise OutcomeUnknown(
                    "connection_lost",
                    f"the connection failed after the request was sent ({type(exc).__name__}); "
                    "whether it took effect is unknown",
                ) from exc
    finally:
        conn.close()


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
        "properties": {"url": {"type": "string", "maxLength": 2048}, "timeout_seconds": TIMEOUT_ARG},
        "required": ["url"],
        "additionalProperties": False,
    },
    read_only=True,
    timeout_seconds=20,
)
def http_get(arguments, context):
    url = _check_url(arguments["url"])
    limit = _limit(arguments, context)
    return _decode(*_request("GET", url, {"User-Agent": "agentrt"}, None, limit, context, abandon_on_cancel=True))


@register(
    name="http_post",
    description="POST a JSON body to a URL on an allowed host (a side effect).",
    parameters={
        "type": "object",
        "properties": {
            "url": {"type": "string", "maxLength": 2048},
            "json": {"type": "object"},
            "timeout_seconds": TIMEOUT_ARG,
        },
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
    headers = {
        "Content-Type": "application/json",
        "Idempotency-Key": context.idempotency_key,
        "X-Agentrt-Attempt": str(context.attempt),
        "User-Agent": "agentrt",
    }
    limit = _limit(arguments, context)
    return _decode(*_request("POST", url, headers, body, limit, context, abandon_on_cancel=False))


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
    control="ask_user",
)
def ask_user(arguments, context):
    raise ToolFailure("control_tool", "ask_user is handled by the runtime, not executed")


@register(
    name="delegate_run",
    description=(
        "Start a child run of another agent with the given input; this run waits until every child run it "
        "started ends, then sees each child's answer (or its failure) as this call's result."
    ),
    parameters={
        "type": "object",
        "properties": {
            "agent": {"type": "string", "minLength": 1, "maxLength": 100},
            "input": {"type": "string", "minLength": 1, "maxLength": 100000},
        },
        "required": ["agent", "input"],
        "additionalProperties": False,
    },
    read_only=True,
    control="delegate",
)
def delegate_run(arguments, context):
    raise ToolFailure("control_tool", "delegate_run is handled by the runtime, not executed")
