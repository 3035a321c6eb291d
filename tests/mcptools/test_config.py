"""AGENTRT_MCP_SERVERS is validated at start, every error naming the field (issue 36 item 1)."""

from __future__ import annotations

import json
import sys

import pytest

from runs.tools.mcp.config import McpConfigError, parse_servers, split_name, tool_name

PY = sys.executable
ENV = {"PATH": "/usr/bin:/bin", "CRM_TOKEN": "secret-value-never-shown"}


def parse(value, hosts=("mcp.example:443", "127.0.0.1:8931")):
    return parse_servers(value, allowed_hosts=list(hosts), environ=ENV)


def error(value, **kw) -> str:
    with pytest.raises(McpConfigError) as err:
        parse(value, **kw)
    return str(err.value)


def test_a_stdio_and_an_http_server_parse():
    servers = parse(
        json.dumps(
            {
                "git": {
                    "command": [PY, "-m", "mcp_server_git"],
                    "env": {"A": "1"},
                    "env_from": ["PATH"],
                    "tools": {"git_status": "read_only", "git_create_branch": "side_effect"},
                    "timeout_seconds": 12,
                },
                "crm": {
                    "url": "https://mcp.example/mcp",
                    "headers_env": {"Authorization": "CRM_TOKEN"},
                    "tools": {"find": "read_only"},
                    "protocol": "2025-11-25",
                },
            }
        )
    )
    git, crm = servers["git"], servers["crm"]
    assert git.transport == "stdio" and git.command[0] == PY and git.timeout_seconds == 12
    assert git.tools == {"git_status": True, "git_create_branch": False}
    assert git.process_env(ENV) == {"A": "1", "PATH": "/usr/bin:/bin"}  # what it names, nothing else
    assert crm.transport == "http" and crm.protocol == "2025-11-25" and crm.timeout_seconds == 30
    assert crm.headers(ENV) == {"Authorization": "secret-value-never-shown"}


def test_empty_means_no_server():
    assert parse("") == {} and parse(None) == {} and parse("  ") == {}


def test_names_of_tools():
    assert tool_name("git", "git_status") == "mcp__git__git_status"
    assert split_name("mcp__git__git_status") == ("git", "git_status")
    assert split_name("mcp__my_srv__a__b") == ("my_srv", "a__b")
    assert split_name("http_post") is None and split_name("mcp__x") is None


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ("not json", "not valid JSON"),
        ("[]", "must be a JSON object"),
        ({"bad__name": {"command": [PY], "tools": {"a": "read_only"}}}, "'bad__name'"),
        ({"s": {"tools": {"a": "read_only"}}}, 's: needs exactly one of "command"'),
        ({"s": {"command": [PY], "url": "https://mcp.example/", "tools": {"a": "read_only"}}}, "s: needs exactly one"),
        ({"s": {"command": [PY]}}, "s.tools: is required"),
        ({"s": {"command": [PY], "tools": {}}}, "s.tools: must name at least one tool"),
        ({"s": {"command": [PY], "tools": {"a": "maybe"}}}, 's.tools.a: must be "read_only" or "side_effect"'),
        ({"s": {"command": [PY], "tools": {"a": True}}}, "s.tools.a: must be"),
        ({"s": {"command": [PY], "tools": {"a.b": "read_only"}}}, "s.tools.a.b: a tool name is"),
        ({"s": {"command": [PY], "tools": {"t" * 60: "read_only"}}}, "longer than 64 characters"),
        ({"s": {"command": [], "tools": {"a": "read_only"}}}, "s.command: must name the program"),
        ({"s": {"command": "python", "tools": {"a": "read_only"}}}, "s.command: must be a list"),
        ({"s": {"command": ["no-such-program-x"], "tools": {"a": "read_only"}}}, "s.command.0: 'no-such-program-x'"),
        ({"s": {"command": [PY], "tools": {"a": "read_only"}, "timeout_seconds": 0}}, "s.timeout_seconds"),
        ({"s": {"command": [PY], "tools": {"a": "read_only"}, "timeout_seconds": "5"}}, "s.timeout_seconds"),
        ({"s": {"command": [PY], "tools": {"a": "read_only"}, "protocol": "2024"}}, "s.protocol: must be one of"),
        ({"s": {"command": [PY], "tools": {"a": "read_only"}, "colour": 1}}, "s.colour: unknown key"),
        ({"s": {"command": [PY], "tools": {"a": "read_only"}, "env": {"A": 1}}}, "s.env.A: must be a string"),
        ({"s": {"command": [PY], "tools": {"a": "read_only"}, "env_from": ["UNSET_X"]}}, "UNSET_X is not set"),
        ({"s": {"command": [PY], "tools": {"a": "read_only"}, "cwd": "/no/such/dir"}}, "s.cwd"),
        ({"s": {"command": [PY], "tools": {"a": "read_only"}, "headers_env": {}}}, "s.headers_env: is for a url"),
        ({"s": {"url": "ftp://mcp.example/", "tools": {"a": "read_only"}}}, "s.url: must be an http or https URL"),
        ({"s": {"url": "https://u:p@mcp.example/", "tools": {"a": "read_only"}}}, "s.url: must not carry a user"),
        ({"s": {"url": "https://other.example/", "tools": {"a": "read_only"}}}, "'other.example:443' is not in"),
        ({"s": {"url": "http://mcp.example:8080/", "tools": {"a": "read_only"}}}, "'mcp.example:8080' is not in"),
        ({"s": {"url": "https://mcp.example/", "tools": {"a": "read_only"}, "env": {}}}, "s.env: is for a stdio"),
        (
            {
                "s": {
                    "url": "https://mcp.example/",
                    "tools": {"a": "read_only"},
                    "headers_env": {"Idempotency-Key": "X"},
                }
            },
            "s.headers_env.Idempotency-Key: is a header the transport or the protocol sets",
        ),
        (
            {"s": {"url": "https://mcp.example/", "tools": {"a": "read_only"}, "headers_env": {"Mcp-Session-Id": "X"}}},
            "s.headers_env.Mcp-Session-Id",
        ),
        (
            {"s": {"url": "https://mcp.example/", "tools": {"a": "read_only"}, "headers_env": {"X-Key": "NOT_SET"}}},
            "s.headers_env.X-Key: the environment variable NOT_SET is not set",
        ),
    ],
)
def test_bad_configuration_is_refused_naming_the_field(spec, names):
    message = error(spec if isinstance(spec, str) else json.dumps(spec))
    assert message.startswith("AGENTRT_MCP_SERVERS: ") and names in message, message


def test_a_metadata_literal_is_refused_even_listed():
    message = error(
        json.dumps({"s": {"url": "http://169.254.169.254/", "tools": {"a": "read_only"}}}), hosts=["169.254.169.254"]
    )
    assert "s.url" in message and "never sent to" in message


def test_a_header_value_never_appears_in_an_error():
    message = error(
        json.dumps(
            {"s": {"url": "https://mcp.example/", "tools": {"a": "maybe"}, "headers_env": {"X-Key": "CRM_TOKEN"}}}
        )
    )
    assert "secret-value-never-shown" not in message


def test_a_bad_setting_stops_the_process_naming_the_field(settings):
    from django.core.exceptions import ImproperlyConfigured

    from runs.tools import REGISTRY, mcp

    snapshot = REGISTRY.snapshot()
    settings.AGENTRT_MCP_SERVERS = json.dumps({"s": {"command": [PY], "tools": {"a": "sometimes"}}})
    try:
        with pytest.raises(ImproperlyConfigured, match=r"AGENTRT_MCP_SERVERS: s\.tools\.a"):
            mcp.load()
    finally:
        settings.AGENTRT_MCP_SERVERS = ""
        mcp.load()
        REGISTRY.restore(snapshot)
