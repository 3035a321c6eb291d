"""Fixtures of the MCP tests (issue 36): the servers' venv, our own effects server (stdio and Streamable HTTP),
and `mcp_servers`, which configures AGENTRT_MCP_SERVERS in this process and puts everything back afterwards."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port, wait_for
from tests.mcptools import servers

FX_TOOLS = {
    "echo": "read_only",
    "env": "read_only",
    "slow_read": "read_only",
    "flaky_read": "read_only",
    "leak": "read_only",
    "write": "side_effect",
    "write_then_die": "side_effect",
    "wait_then_write": "side_effect",
    "fail": "side_effect",
}


@pytest.fixture(scope="session")
def mcp_venv() -> Path:
    return servers.ensure()


class State:
    """The effects server's state directory, read back."""

    def __init__(self, path: Path):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)

    def lines(self, name: str) -> list[dict]:
        f = self.path / name
        return [json.loads(line) for line in f.read_text().splitlines() if line.strip()] if f.exists() else []

    def effects(self) -> list[dict]:
        return self.lines("effects.jsonl")

    def calls(self, tool: str | None = None) -> list[dict]:
        return [c for c in self.lines("calls.jsonl") if tool is None or c["tool"] == tool]

    def touch(self, name: str) -> None:
        (self.path / name).write_text("1")


@pytest.fixture
def fx_state(tmp_path) -> State:
    return State(tmp_path / "fx-state")


def fx_stdio(state: State, *, timeout: float = 10, tools: dict | None = None, **extra) -> dict:
    """The effects server over stdio, as configuration."""
    return {
        "command": [sys.executable, str(servers.EFFECTS_SERVER)],
        "env": {"MCP_TEST_STATE": str(state.path)},
        "tools": tools or FX_TOOLS,
        "timeout_seconds": timeout,
        **extra,
    }


@pytest.fixture
def fx_http(fx_state, tmp_path):
    """The effects server over Streamable HTTP on loopback: yields (url, host:port, process)."""
    port = free_port()
    log = open(tmp_path / "fx-http.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, str(servers.EFFECTS_SERVER), "--http", str(port)],
        cwd=ROOT,
        env={"MCP_TEST_STATE": str(fx_state.path), "PATH": "/usr/bin:/bin"},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )

    def up():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return proc.poll() is not None  # died: the assertion below says so

    wait_for(up, timeout=60, message="the effects server to listen")
    assert proc.poll() is None, (tmp_path / "fx-http.log").read_text()
    yield f"http://127.0.0.1:{port}/mcp", f"127.0.0.1:{port}", proc
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    log.close()


@pytest.fixture
def mcp_servers(settings):
    """`configure({name: server})` sets AGENTRT_MCP_SERVERS here and registers its tools; at the end this
    process's servers are stopped and the registry is as it was."""
    from runs.tools import REGISTRY, mcp
    from runs.tools.mcp import client

    snapshot = REGISTRY.snapshot()
    before = settings.AGENTRT_MCP_SERVERS

    def configure(spec: dict, *, hosts: list[str] | None = None) -> list[str]:
        if hosts is not None:
            settings.AGENTRT_HTTP_TOOL_ALLOWED_HOSTS = hosts
        settings.AGENTRT_MCP_SERVERS = json.dumps(spec)
        return mcp.load()

    yield configure
    client.stop()
    settings.AGENTRT_MCP_SERVERS = before
    mcp.load()
    REGISTRY.restore(snapshot)
