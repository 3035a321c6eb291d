"""The MCP tests' fixtures (tests/mcptools/fixtures.py), offered to every test here."""

from __future__ import annotations

from tests.mcptools.fixtures import fx_http as fx_http
from tests.mcptools.fixtures import fx_state as fx_state
from tests.mcptools.fixtures import mcp_servers as mcp_servers
from tests.mcptools.fixtures import mcp_venv as mcp_venv
