"""MCP tools in runs (issue 36, items 1–4), in-process on PostgreSQL (`run_drive`), against our own effects server
(the SDK's FastMCP, tests/mcptools/effects_server.py) over stdio and Streamable HTTP."""

from __future__ import annotations

import pytest

from approvals.models import Approval
from approvals.services import approval_decide
from checkpoints.repository import checkpoint_latest
from runs.errors import InvalidInput
from runs.models import Event, Run, ToolInvocation
from runs.runtime.executor import run_drive
from runs.tools import REGISTRY
from tests.mcptools.fixtures import fx_stdio

pytestmark = pytest.mark.django_db(transaction=True)

WRITE = "mcp__fx__write"


def reload(run):
    return Run.objects.get(id=run.id)


def tool_messages(run):
    return [m for m in checkpoint_latest(run.id).conversation if m.get("role") == "tool"]


def call(tool, **arguments):
    return {"tool_calls": [{"name": tool, "arguments": arguments}]}


def approve(operator, run):
    approval = Approval.objects.get(run=run, status="pending")
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash, via="api")
    return approval


@pytest.fixture
def fx(mcp_servers, fx_state):
    mcp_servers({"fx": fx_stdio(fx_state)})
    return fx_state


def test_configured_tools_are_registered_with_our_classification(fx):
    names = [n for n in REGISTRY.names() if n.startswith("mcp__fx__")]
    assert WRITE in names and "mcp__fx__echo" in names
    # The server annotates `write` readOnlyHint=true, destructiveHint=false: only the configuration decides.
    assert REGISTRY.spec(WRITE).read_only is False and REGISTRY.spec(WRITE).side_effect == "external_write"
    assert REGISTRY.spec("mcp__fx__echo").read_only is True


def test_publishing_pins_each_tools_listing_into_the_version(fx, load_agent):
    version = load_agent(tools=(WRITE, "mcp__fx__echo", "echo"))
    pins = version.definition["mcp_tools"]
    assert set(pins) == {WRITE, "mcp__fx__echo"}
    pin = pins[WRITE]
    assert pin["server"] == "fx" and pin["tool"] == "write" and len(pin["digest"]) == 64
    assert pin["input_schema"]["properties"]["name"]["type"] == "string"
    # The server's annotations, kept as hints (its title, markup and all, is text to escape wherever it is shown).
    assert pin["annotations"] == {"readOnlyHint": True, "title": "<script>alert('title')</script>"}
    assert fx.calls() == []  # listing is not calling
    # Publishing the same definition again, the server unchanged: the same version.
    assert load_agent(tools=(WRITE, "mcp__fx__echo", "echo")).version == version.version
    fx.touch("changed")  # the server now lists `write` with another schema: a new version pins that
    assert load_agent(tools=(WRITE, "mcp__fx__echo", "echo")).version != version.version


def test_a_publisher_cannot_bring_its_own_pin(fx, tenant):
    from runs.services import agent_load

    definition = {
        "name": "bot",
        "model": {"provider": "scripted", "turns": [{"text": "x"}]},
        "tools": [WRITE],
        "mcp_tools": {WRITE: {"server": "fx", "tool": "write", "digest": "0" * 64}},
    }
    with pytest.raises(InvalidInput) as err:
        agent_load(tenant=tenant, definition=definition)
    assert "mcp_tools" in err.value.fields


def test_a_server_that_does_not_list_the_tool_is_refused_naming_tools(mcp_servers, fx_state, load_agent):
    mcp_servers({"fx": fx_stdio(fx_state, tools={"write": "side_effect", "no_such_tool": "read_only"})})
    with pytest.raises(InvalidInput) as err:
        load_agent(tools=("mcp__fx__no_such_tool",))
    assert "tools" in err.value.fields and "does not list a tool named 'no_such_tool'" in err.value.message


def test_a_server_that_cannot_start_is_refused_naming_tools(mcp_servers, tmp_path, load_agent):
    script = tmp_path / "dies.sh"
    script.write_text("#!/bin/sh\nexit 3\n")
    script.chmod(0o755)
    mcp_servers({"dead": {"command": [str(script)], "tools": {"t": "read_only"}, "timeout_seconds": 5}})
    with pytest.raises(InvalidInput) as err:
        load_agent(tools=("mcp__dead__t",))
    assert "tools" in err.value.fields and "'dead' could not be listed" in err.value.message


def test_the_tenants_allowed_tools_apply_to_mcp_tools(fx, tenant, load_agent):
    from runs.errors import ToolNotAllowed

    tenant.allowed_tools = ["echo", "mcp__fx__echo"]
    tenant.save()
    load_agent(tools=("mcp__fx__echo",))
    with pytest.raises(ToolNotAllowed) as err:
        load_agent(name="writer", tools=(WRITE,))
    assert WRITE in err.value.message


def test_a_read_only_call_runs_and_the_model_sees_its_answer(fx, load_agent, submit):
    load_agent(turns=[call("mcp__fx__echo", text="hello"), {"text": "done"}], tools=("mcp__fx__echo",))
    run = submit()
    run_drive(run_id=run.id)
    assert reload(run).status == "COMPLETED"
    inv = ToolInvocation.objects.get(run=run)
    assert inv.read_only and inv.effect_sent_at is None and inv.outcome == "succeeded"
    assert inv.result["content"] == [{"type": "text", "text": "hello"}]
    (message,) = tool_messages(run)
    assert "hello" in message["content"] and not message["is_error"]
    (received,) = fx.calls("echo")
    assert received["key"] == inv.idempotency_key


def test_a_side_effect_takes_the_pipeline_and_is_sent_once_with_its_key(fx, load_agent, submit):
    load_agent(turns=[call(WRITE, name="a"), {"text": "done"}], tools=(WRITE,))
    run = submit()
    run_drive(run_id=run.id)
    assert reload(run).status == "COMPLETED"
    inv = ToolInvocation.objects.get(run=run)
    assert not inv.read_only and inv.side_effect == "external_write"
    assert inv.effect_sent_at is not None and inv.outcome == "succeeded"  # the watermark came first
    (effect,) = fx.effects()
    assert effect["name"] == "a" and effect["key"] == inv.idempotency_key
    started = Event.objects.get(run=run, type="tool.call.started")
    assert started.payload["idempotency_key"] == inv.idempotency_key


def test_the_arguments_are_validated_against_the_pinned_schema(fx, load_agent, submit):
    load_agent(turns=[call(WRITE, name=5), {"text": "done"}], tools=(WRITE,))
    run = submit()
    run_drive(run_id=run.id)
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "failed" and inv.result["error"] == "schema_invalid" and inv.effect_sent_at is None
    assert fx.calls() == []


def test_a_tool_error_is_a_failed_result_the_model_sees(fx, load_agent, submit):
    load_agent(turns=[call("mcp__fx__fail"), {"text": "done"}], tools=("mcp__fx__fail",))
    run = submit()
    run_drive(run_id=run.id)
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "failed" and inv.outcome == "failed" and inv.result["error"] == "mcp_tool_error"
    (message,) = tool_messages(run)
    assert message["is_error"]


def test_a_servers_answer_is_scrubbed_like_any_tool_result(fx, load_agent, submit):
    load_agent(turns=[call("mcp__fx__leak"), {"text": "done"}], tools=("mcp__fx__leak",))
    run = submit()
    run_drive(run_id=run.id)
    inv = ToolInvocation.objects.get(run=run)
    text = str(inv.result)
    assert "sk-live-abcdefghijklmnopqrstuvwxyz0123456789" not in text and "[REDACTED]" in text
