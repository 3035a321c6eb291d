"""Real `qcluster` workers SIGKILLed at the fault points around an MCP side effect (issue 36), with a real
`run_maintenance` reclaiming their runs: an interrupted MCP call goes to a decision and is never sent a second
time without one; a killed worker leaves no MCP server behind, and a cluster that stops stops its servers.

The side effects go to our own MCP server (tests/mcptools/effects_server.py, over stdio: each worker process
starts its own), which records every effect with the idempotency key it came with; the branch test uses the
real `mcp-server-git` from PyPI on a scratch repository."""

from __future__ import annotations

import json

import pytest

from approvals.models import Approval
from approvals.services import approval_decide
from runs.models import Event, Run, ToolInvocation
from tests.conftest import wait_for
from tests.fault.test_kill_points import marker, park_or_end, status
from tests.mcptools import servers
from tests.mcptools.fixtures import fx_state as fx_state
from tests.mcptools.fixtures import fx_stdio
from tests.mcptools.fixtures import mcp_servers as mcp_servers
from tests.mcptools.fixtures import mcp_venv as mcp_venv
from tests.mcptools.test_real_servers import GIT_ENV, branches
from tests.mcptools.test_real_servers import repo as repo
from tests.procfs import stat

pytestmark = [pytest.mark.fault, pytest.mark.django_db(transaction=True)]

WRITE = "mcp__fx__write"


def gone(pid: int) -> bool:
    s = stat(pid)
    return s is None or s[0] == "Z"


@pytest.fixture
def fx_cluster(stack, mcp_servers, fx_state, load_agent):
    """A cluster whose workers call the effects server; the agent writes once, then answers."""
    spec = {"fx": fx_stdio(fx_state, tools={"write": "side_effect", "echo": "read_only"})}
    mcp_servers(spec)  # this process publishes (and pins) with the same configuration
    load_agent(
        turns=[{"tool_calls": [{"name": WRITE, "arguments": {"name": "once"}}]}, {"text": "done"}], tools=(WRITE,)
    )

    def start(faults: str):
        return stack(faults, AGENTRT_MCP_SERVERS=json.dumps(spec))

    return start


def test_sigkill_after_the_watermark_parks_the_call_and_approval_sends_it_once(
    fx_cluster, fx_state, submit, tmp_path, operator
):
    fx_cluster("tool.after_watermark=kill")
    run = submit()
    park_or_end(run)
    assert marker(tmp_path, "tool.after_watermark", run).exists()
    assert fx_state.effects() == []  # the worker died between the watermark and the send
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "interrupted" and inv.effect_sent_at is not None and inv.attempt == 1
    approval = Approval.objects.get(run=run, status="pending")
    assert approval.kind == "interrupted_side_effect" and approval.presentation["mcp"]["server"] == "fx"
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash, via="api")
    wait_for(lambda: status(run) == "COMPLETED", timeout=90, message="completion after approval")
    (effect,) = fx_state.effects()
    assert effect["key"] == ToolInvocation.objects.get(run=run).idempotency_key
    assert ToolInvocation.objects.get(run=run).attempt == 2


def test_sigkill_after_the_call_leaves_one_effect_a_decision_and_no_server_behind(
    fx_cluster, fx_state, submit, tmp_path, operator
):
    fx_cluster("tool.after_execute=kill")
    run = submit()
    park_or_end(run)
    (effect,) = fx_state.effects()  # it happened; the worker died before recording it
    server_pid = effect["pid"]
    wait_for(lambda: gone(server_pid), timeout=30, message=f"the dead worker's MCP server {server_pid} to die too")
    assert Event.objects.filter(run=run, type="lease.taken_over").exists()
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "interrupted" and inv.attempt == 1
    approval = Approval.objects.get(run=run, status="pending")
    assert approval.kind == "interrupted_side_effect"
    approval_decide(
        user=operator, approval_id=approval.id, approve=False, request_hash=approval.request_hash, via="api"
    )
    assert status(run) == "FAILED" and Run.objects.get(id=run.id).failure["reason"] == "operator_rejected"
    assert len(fx_state.effects()) == 1 and len(fx_state.calls("write")) == 1


def test_a_cluster_that_stops_stops_its_mcp_servers(fx_cluster, fx_state, submit):
    c = fx_cluster("")
    run = submit()
    wait_for(lambda: status(run) == "COMPLETED", timeout=90, message=f"the run\n{c.output()[-3000:]}")
    (effect,) = fx_state.effects()
    assert not gone(effect["pid"])  # the worker keeps its server for its next call
    c.stop()
    wait_for(lambda: gone(effect["pid"]), timeout=30, message="the stopped worker's MCP server to exit")
    # Stopped on the worker's way out (its stdin closed), not killed: it exited cleanly.
    assert {"pid": effect["pid"]} in fx_state.lines("exited.jsonl"), c.output()[-3000:]


def test_sigkill_after_git_create_branch_asks_before_any_second_branch(
    stack, mcp_servers, mcp_venv, repo, load_agent, submit, tmp_path, operator
):
    spec = {
        "git": {
            "command": [servers.bin_path("mcp-server-git"), "--repository", str(repo)],
            "env": GIT_ENV,
            "env_from": ["PATH"],
            "tools": {"git_create_branch": "side_effect"},
            "timeout_seconds": 20,
        }
    }
    mcp_servers(spec)
    create = "mcp__git__git_create_branch"
    load_agent(
        turns=[
            {"tool_calls": [{"name": create, "arguments": {"repo_path": str(repo), "branch_name": "first"}}]},
            {"text": "done"},
        ],
        tools=(create,),
    )
    stack("tool.after_execute=kill", AGENTRT_MCP_SERVERS=json.dumps(spec))
    run = submit()
    park_or_end(run)
    assert branches(repo) == ["first", "main"]  # made once, by the worker that died
    approval = Approval.objects.get(run=run, status="pending")
    assert approval.kind == "interrupted_side_effect"
    assert ToolInvocation.objects.get(run=run).attempt == 1  # nothing sent again while it waits
    approval_decide(
        user=operator, approval_id=approval.id, approve=False, request_hash=approval.request_hash, via="api"
    )
    assert status(run) == "FAILED" and branches(repo) == ["first", "main"]
