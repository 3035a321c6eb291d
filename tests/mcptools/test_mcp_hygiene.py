"""Process hygiene and the outbound rules for MCP servers (issue 36 items 1 and 6): a stdio server gets only the
environment its configuration names, its stderr reaches the log scrubbed and bounded; a Streamable HTTP server
is reached only where runs.net allows."""

from __future__ import annotations

import logging
import sys

import pytest

from runs.errors import InvalidInput
from runs.models import ToolInvocation
from runs.runtime.executor import run_drive
from runs.tools.mcp import client
from tests.mcptools import servers
from tests.mcptools.fixtures import fx_stdio
from tests.mcptools.test_mcp_runs import call

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_stdio_server_gets_only_the_environment_its_configuration_names(
    mcp_servers, fx_state, load_agent, submit, monkeypatch
):
    monkeypatch.setenv("AGENTRT_TEST_CANARY", "sk-live-canary0123456789abcdefghij")
    monkeypatch.setenv("MCP_TEST_KEPT", "kept")
    mcp_servers({"fx": fx_stdio(fx_state, env_from=["MCP_TEST_KEPT"])})
    load_agent(turns=[call("mcp__fx__env"), {"text": "done"}], tools=("mcp__fx__env",))
    run = submit()
    run_drive(run_id=run.id)
    names = ToolInvocation.objects.get(run=run).result["structured"]["result"]
    # Not DATABASE_URL, not DJANGO_SECRET_KEY, not the canary, not even PATH: what the configuration names.
    assert names == ["MCP_TEST_KEPT", "MCP_TEST_STATE"]


def test_a_servers_stderr_reaches_the_log_scrubbed_and_bounded(mcp_servers, fx_state, load_agent, caplog):
    noisy = (
        "import runpy, sys\n"
        "for i in range(400):\n"
        "    print('noise', i, 'token sk-live-abcdefghijklmnopqrstuvwxyz0123456789', 'x' * 900, file=sys.stderr)\n"
        f"sys.argv = [{str(servers.EFFECTS_SERVER)!r}]\n"
        f"runpy.run_path({str(servers.EFFECTS_SERVER)!r}, run_name='__main__')\n"
    )
    spec = fx_stdio(fx_state)
    spec["command"] = [sys.executable, "-c", noisy]
    mcp_servers({"fx": spec})
    with caplog.at_level(logging.INFO, logger="agentrt.mcp"):
        load_agent(tools=("mcp__fx__echo",))  # starts the server (listing its tools)
        client.stop()  # its stderr ends: what was not logged is counted
    lines = [r.getMessage() for r in caplog.records if "stderr:" in r.getMessage()]
    assert 0 < len(lines) <= 120
    assert all(len(line.split("stderr: ", 1)[1]) <= 500 for line in lines)
    assert not any("sk-live-abcdefghij" in line for line in lines) and any("[REDACTED]" in line for line in lines)
    dropped = [r.getMessage() for r in caplog.records if "lines of stderr not logged" in r.getMessage()]
    assert dropped and sum(int(m.split(": ")[1].split()[0]) for m in dropped) + len(lines) >= 400


def test_an_http_server_behind_an_allowed_name_that_resolves_to_loopback_is_refused(
    mcp_servers, fx_state, fx_http, load_agent, settings
):
    """An allow-listed *name* whose addresses are internal (here localhost) is refused unless the operator
    also lists it in AGENTRT_OUTBOUND_INTERNAL_NAMES (DNS rebinding)."""
    url, host, _ = fx_http
    port = host.split(":")[1]
    named = url.replace("127.0.0.1", "localhost")
    settings.AGENTRT_OUTBOUND_INTERNAL_NAMES = []
    mcp_servers({"fxh": {"url": named, "tools": {"echo": "read_only"}}}, hosts=[f"localhost:{port}"])
    with pytest.raises(InvalidInput) as err:
        load_agent(tools=("mcp__fxh__echo",))
    assert "could not be listed" in err.value.message and fx_state.calls() == []
    client.stop()
    settings.AGENTRT_OUTBOUND_INTERNAL_NAMES = ["localhost"]
    mcp_servers({"fxh": {"url": named, "tools": {"echo": "read_only"}}}, hosts=[f"localhost:{port}"])
    assert "mcp__fxh__echo" in load_agent(tools=("mcp__fxh__echo",)).definition["mcp_tools"]


def test_a_server_of_the_2025_11_25_era_is_spoken_to_with_the_handshake(mcp_servers, fx_state, load_agent, submit):
    """`protocol: auto` probes `server/discover`; a server that does not know it gets `initialize` and a session:
    whichever the server answers."""
    legacy = {
        "command": [sys.executable, str(servers.EFFECTS_SERVER.parent / "legacy_server.py")],
        "env": {"MCP_TEST_STATE": str(fx_state.path)},
        "tools": {"write": "side_effect"},
    }
    mcp_servers({"old": legacy})
    load_agent(turns=[call("mcp__old__write", name="x"), {"text": "done"}], tools=("mcp__old__write",))
    run = submit()
    run_drive(run_id=run.id)
    methods = [line["method"] for line in fx_state.lines("legacy.jsonl")]
    assert methods[:3] == ["server/discover", "initialize", "notifications/initialized"]
    assert "tools/call" in methods and methods.count("tools/call") == 1
    inv = ToolInvocation.objects.get(run=run)
    assert inv.outcome == "succeeded" and inv.effect_sent_at is not None and not inv.read_only
    (effect,) = fx_state.effects()
    assert effect["key"] == inv.idempotency_key


@pytest.mark.parametrize("protocol", ["2025-11-25", "2026-07-28"])
def test_either_era_may_be_forced_over_http(protocol, mcp_servers, fx_state, fx_http, load_agent, submit):
    url, host, _ = fx_http
    mcp_servers({"fxh": {"url": url, "tools": {"write": "side_effect"}, "protocol": protocol}}, hosts=[host])
    load_agent(turns=[call("mcp__fxh__write", name=protocol), {"text": "done"}], tools=("mcp__fxh__write",))
    run = submit()
    run_drive(run_id=run.id)
    inv = ToolInvocation.objects.get(run=run)
    (effect,) = fx_state.effects()
    assert effect["name"] == protocol and effect["key"] == effect["header_key"] == inv.idempotency_key
