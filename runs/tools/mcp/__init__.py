"""MCP servers' tools, as durable and as governed as our own.

- `config`: `AGENTRT_MCP_SERVERS`, validated (the operator's servers and the class of each tool);
- `transport`: stdio (our own: the environment named, no orphans, stderr bounded) and Streamable HTTP
  (the SDK's, over an httpx2 client held to runs.net), and whether a request left;
- `client`: one client per server per process on a loop of its own (the official `mcp` SDK, both protocol eras);
- `pin`: a server's `tools/list` entry pinned into an agent version;
- `tools`: registration, the run's `PinnedTools` port, the call and its classification.

`load()` (the runs app's `ready`, through runs.extensions) parses the setting
and registers the tools; a bad value stops the process naming the field.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from runs.tools.mcp.config import SETTING, McpConfigError, ServerConfig, parse_servers, split_name, tool_name
from runs.tools.mcp.tools import (
    DEFINITION_KEY,
    INTERNAL_NAMES,
    SERVERS,
    PinFailed,
    pins_for,
    register,
    server_of,
    shown,
    tools_for,
)

__all__ = [
    "DEFINITION_KEY",
    "SERVERS",
    "SETTING",
    "McpConfigError",
    "PinFailed",
    "ServerConfig",
    "load",
    "parse_servers",
    "pins_for",
    "server_of",
    "shown",
    "split_name",
    "tool_name",
    "tools_for",
]


def load() -> list[str]:
    """Parse AGENTRT_MCP_SERVERS and register its tools; ImproperlyConfigured naming the field otherwise."""
    try:
        servers = parse_servers(
            getattr(settings, SETTING, None), allowed_hosts=settings.AGENTRT_HTTP_TOOL_ALLOWED_HOSTS
        )
        names = register(servers)
    except (McpConfigError, ValueError) as exc:
        raise ImproperlyConfigured(str(exc)) from None
    INTERNAL_NAMES[0] = tuple(settings.AGENTRT_OUTBOUND_INTERNAL_NAMES)
    return names
