"""`AGENTRT_MCP_SERVERS`: the MCP servers an operator makes available.

Operator configuration, like model endpoints: a tenant's agent names a tool
(`mcp__<server>__<tool>`), never a command, a URL or a header. JSON:

    {"git":  {"command": ["/opt/mcp/bin/mcp-server-git", "--repository", "/srv/repo"],
              "env": {"GIT_AUTHOR_NAME": "agentrt"}, "env_from": ["PATH"],
              "tools": {"git_status": "read_only", "git_create_branch": "side_effect"},
              "timeout_seconds": 20},
     "crm":  {"url": "https://mcp.crm.example/mcp", "headers_env": {"Authorization": "CRM_MCP_AUTH"},
              "tools": {"find_customer": "read_only", "create_ticket": "side_effect"}}}

- `command` (stdio; a list: the program, then its arguments) or `url`
  (Streamable HTTP), exactly one. A program without a slash is looked up on
  the PATH when the process starts; it must exist.
- `env`: the stdio server's environment, literally; `env_from`: names copied
  from this process's environment (each must be set). The server gets those
  and nothing else — not even PATH unless named.
- `cwd`: the stdio server's working directory (optional; must exist).
- `url`: `http(s)://host[:port]/path`, no user or fragment; its host and port
  must be on `AGENTRT_HTTP_TOOL_ALLOWED_HOSTS` (runs.net.listed), and every
  connection goes only to addresses runs.net lets a request go to.
- `headers_env`: `{"Header-Name": "ENV_VAR"}`: the header's value is read
  from the environment variable (which must be set) when a connection opens;
  the value never appears in configuration, logs or errors. Headers the
  protocol owns (Idempotency-Key, Mcp-*, Content-Type, Host...) are refused.
- `tools`: the tools of the server agents may use, each classified by the
  operator: `"read_only"` or `"side_effect"`. The server's own annotations
  (`readOnlyHint`, ...) are hints shown to people, never trusted.
- `timeout_seconds` (default 30, at most 600): every request to the server.
- `protocol` (default `"auto"`: `server/discover`, falling back to the
  2025-11-25 handshake): `"2025-11-25"` forces the handshake,
  `"2026-07-28"` the stateless protocol.

`parse_servers` refuses anything else with `McpConfigError` naming the field
(`AGENTRT_MCP_SERVERS: git.tools.git_push: ...`); the runs app turns it
into `ImproperlyConfigured` at start. No Django here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from runs import net
from runs.errors import AddressRefused

SETTING = "AGENTRT_MCP_SERVERS"
PREFIX = "mcp__"
SEPARATOR = "__"
# A server name never holds "__", so `mcp__<server>__<tool>` splits at its first separator.
SERVER_NAME = re.compile(r"^[A-Za-z0-9]+(?:[-_][A-Za-z0-9]+)*$")
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,199}$")
HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}$")
MAX_NAME = 64  # the longest function name the model APIs accept (OpenAI: 64)
MAX_SERVERS = 50
MAX_TOOLS = 200
DEFAULT_TIMEOUT = 30.0
MAX_TIMEOUT = 600.0
PROTOCOLS = ("auto", "2025-11-25", "2026-07-28")
CLASSES = ("read_only", "side_effect")
# Headers the transport and the protocol set: a configured header never replaces one.
RESERVED_HEADERS = frozenset(
    h.lower()
    for h in (
        "Host",
        "Content-Type",
        "Content-Length",
        "Transfer-Encoding",
        "Connection",
        "Accept",
        "Idempotency-Key",
        "Last-Event-ID",
        "MCP-Session-Id",
        "MCP-Protocol-Version",
        "Mcp-Method",
        "Mcp-Name",
    )
)
_KEYS = {"command", "env", "env_from", "cwd", "url", "headers_env", "tools", "timeout_seconds", "protocol"}


class McpConfigError(ValueError):
    """AGENTRT_MCP_SERVERS is not valid; the message names the field."""


@dataclass(frozen=True)
class ServerConfig:
    name: str
    tools: Mapping[str, bool]  # tool -> read_only (the operator's classification, never the server's)
    timeout_seconds: float = DEFAULT_TIMEOUT
    protocol: str = "auto"
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    env_from: tuple[str, ...] = ()
    cwd: str | None = None
    url: str | None = None
    headers_env: Mapping[str, str] = field(default_factory=dict)

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "http"

    def process_env(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """The stdio server's whole environment: `env`, then `env_from` read now."""
        environ = os.environ if environ is None else environ
        out = dict(self.env)
        for name in self.env_from:
            if name in environ:
                out[name] = environ[name]
        return out

    def headers(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """The configured headers with their values read now (a variable unset since start is left out)."""
        environ = os.environ if environ is None else environ
        return {header: environ[var] for header, var in self.headers_env.items() if var in environ}


def tool_name(server: str, tool: str) -> str:
    """The registry's (and the model's) name of a server's tool."""
    return f"{PREFIX}{server}{SEPARATOR}{tool}"


def split_name(name: str) -> tuple[str, str] | None:
    """(server, tool) of an `mcp__<server>__<tool>` name, or None."""
    if not name.startswith(PREFIX):
        return None
    server, sep, tool = name[len(PREFIX) :].partition(SEPARATOR)
    if not sep or not server or not tool:
        return None
    return server, tool


def _fail(where: str, message: str) -> McpConfigError:
    return McpConfigError(f"{SETTING}: {where}: {message}")


def _strings(value: Any, where: str, *, pattern: re.Pattern | None = None, what: str = "a string") -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(where, f"must be a list of {what}s")
    if pattern is not None:
        for v in value:
            if not pattern.match(v):
                raise _fail(where, f"{v!r} is not {what}")
    return value


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(where, "must be a JSON object")
    return value


def _command(value: Any, where: str, path: str | None) -> tuple[str, ...]:
    parts = _strings(value, where)
    if not parts or not parts[0].strip():
        raise _fail(where, "must name the program to run (a non-empty list: program, then arguments)")
    if any("\x00" in p for p in parts):
        raise _fail(where, "must not contain NUL characters")
    program = parts[0]
    found = program if "/" in program else shutil.which(program, path=path)
    if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise _fail(f"{where}.0", f"{program!r} is not an executable file (a bare name is looked up on the PATH)")
    return (os.path.abspath(found), *parts[1:])


def _url(value: Any, where: str, allowed_hosts: Iterable[str]) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(where, "must be an http or https URL")
    parts = urlsplit(value)
    try:
        port = parts.port
    except ValueError:
        raise _fail(where, "the port is not valid") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _fail(where, "must be an http or https URL with a host")
    if parts.username is not None or parts.password is not None:
        raise _fail(where, "must not carry a user or password (name a header in headers_env)")
    if parts.fragment:
        raise _fail(where, "must not have a fragment")
    host = parts.hostname
    port = port or net.default_port(parts.scheme)
    if not net.listed(host, port, allowed_hosts):
        raise _fail(
            where,
            f"{net.shown(host, port)!r} is not in AGENTRT_HTTP_TOOL_ALLOWED_HOSTS "
            "(a bare host there admits ports 80 and 443 only)",
        )
    try:
        net.refuse_literal(host)
    except AddressRefused as exc:
        raise _fail(where, str(exc)) from None
    return value


def _tools(value: Any, where: str, server: str) -> dict[str, bool]:
    tools = _mapping(value, where)
    if not tools:
        raise _fail(where, 'must name at least one tool, each "read_only" or "side_effect"')
    if len(tools) > MAX_TOOLS:
        raise _fail(where, f"at most {MAX_TOOLS} tools")
    out = {}
    for tool, kind in tools.items():
        here = f"{where}.{tool}"
        if not TOOL_NAME.match(tool):
            raise _fail(here, "a tool name is letters, digits, '_' and '-' (what model APIs accept)")
        if len(tool_name(server, tool)) > MAX_NAME:
            raise _fail(here, f"{tool_name(server, tool)!r} is longer than {MAX_NAME} characters")
        if kind not in CLASSES:
            raise _fail(here, 'must be "read_only" or "side_effect" (our classification; the server\'s hints are not)')
        out[tool] = kind == "read_only"
    return out


def _server(  # noqa: C901 - one check per field of a server's configuration, each with its own error
    name: Any, raw: Any, allowed_hosts: Iterable[str], environ: Mapping[str, str]
) -> ServerConfig:
    if not isinstance(name, str) or not SERVER_NAME.match(name) or len(name) > 32:
        raise _fail(
            repr(name), "a server name is letters and digits, single '-' or '_' between them, at most 32 characters"
        )
    spec = _mapping(raw, name)
    unknown = sorted(set(spec) - _KEYS)
    if unknown:
        raise _fail(f"{name}.{unknown[0]}", f"unknown key (known: {', '.join(sorted(_KEYS))})")
    if ("command" in spec) == ("url" in spec):
        raise _fail(name, 'needs exactly one of "command" (a stdio server) and "url" (Streamable HTTP)')
    if "tools" not in spec:
        raise _fail(f"{name}.tools", 'is required: {"<tool>": "read_only" | "side_effect"}')
    tools = _tools(spec["tools"], f"{name}.tools", name)
    timeout = spec.get("timeout_seconds", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT:
        raise _fail(f"{name}.timeout_seconds", f"must be a number of seconds, more than 0 and at most {MAX_TIMEOUT:g}")
    protocol = spec.get("protocol", "auto")
    if protocol not in PROTOCOLS:
        raise _fail(f"{name}.protocol", f"must be one of {', '.join(PROTOCOLS)}")
    common: dict[str, Any] = {"name": name, "tools": tools, "timeout_seconds": float(timeout), "protocol": protocol}
    if "url" in spec:
        for key in ("env", "env_from", "cwd"):
            if key in spec:
                raise _fail(f"{name}.{key}", "is for a stdio server (command), not a url")
        headers = _mapping(spec.get("headers_env", {}), f"{name}.headers_env")
        seen = set()
        for header, var in headers.items():
            here = f"{name}.headers_env.{header}"
            if not HEADER_NAME.match(header):
                raise _fail(here, "is not a valid header name")
            if header.lower() in RESERVED_HEADERS or header.lower().startswith("mcp-"):
                raise _fail(here, "is a header the transport or the protocol sets; it cannot be configured")
            if header.lower() in seen:
                raise _fail(here, "is named twice")
            seen.add(header.lower())
            if not isinstance(var, str) or not ENV_NAME.match(var):
                raise _fail(here, "must name an environment variable")
            if var not in environ:
                raise _fail(here, f"the environment variable {var} is not set")
        return ServerConfig(url=_url(spec["url"], f"{name}.url", allowed_hosts), headers_env=dict(headers), **common)
    if "headers_env" in spec:
        raise _fail(f"{name}.headers_env", "is for a url server, not a command")
    env = _mapping(spec.get("env", {}), f"{name}.env")
    for var, value in env.items():
        if not ENV_NAME.match(var):
            raise _fail(f"{name}.env.{var}", "is not a valid environment variable name")
        if not isinstance(value, str) or "\x00" in value:
            raise _fail(f"{name}.env.{var}", "must be a string")
    env_from = _strings(
        spec.get("env_from", []), f"{name}.env_from", pattern=ENV_NAME, what="an environment variable name"
    )
    for var in env_from:
        if var not in environ:
            raise _fail(f"{name}.env_from", f"the environment variable {var} is not set")
    cwd = spec.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or not os.path.isdir(cwd)):
        raise _fail(f"{name}.cwd", "must be an existing directory")
    path = env.get("PATH") or (environ.get("PATH") if "PATH" in env_from else None) or environ.get("PATH")
    return ServerConfig(
        command=_command(spec["command"], f"{name}.command", path),
        env=dict(env),
        env_from=tuple(env_from),
        cwd=cwd,
        **common,
    )


def parse_servers(
    value: str | Mapping[str, Any] | None,
    *,
    allowed_hosts: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> dict[str, ServerConfig]:
    """The servers of `value` (the setting's JSON text, or the object already
    parsed; empty or None: no server), each validated; `McpConfigError`
    naming the field otherwise."""
    environ = os.environ if environ is None else environ
    if value is None or (isinstance(value, str) and not value.strip()):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise McpConfigError(f"{SETTING}: not valid JSON ({exc})") from None
    if not isinstance(value, Mapping):
        raise McpConfigError(f'{SETTING}: must be a JSON object {{"<server>": {{...}}}}')
    if len(value) > MAX_SERVERS:
        raise McpConfigError(f"{SETTING}: at most {MAX_SERVERS} servers")
    allowed = list(allowed_hosts)
    return {name: _server(name, raw, allowed, environ) for name, raw in value.items()}
