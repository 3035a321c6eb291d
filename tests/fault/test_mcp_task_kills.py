"""A long MCP operation survives its worker (issue 36 item 5): a real `qcluster` worker SIGKILLed while the
task it started runs, a real `run_maintenance` taking the run over. The server (our own, the SDK's
`MCPServer` over Streamable HTTP: tests/mcptools/tasks_server.py, a process of its own, as a job system is)
answers the call with a task; the worker commits the task id to the call's record and dies right then
(fault point `tool.after_remote_recorded`). The takeover does not ask a person: it polls `tasks/get` for
that task, and the task's result becomes the call's — the server never sees a second `tools/call`."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from approvals.models import Approval
from runs.models import Event, Run, ToolInvocation
from tests.conftest import ROOT, free_port, wait_for
from tests.mcptools.fixtures import State
from tests.mcptools.fixtures import mcp_servers as mcp_servers
from tests.mcptools.test_mcp_long import TASKS_SERVER

pytestmark = [pytest.mark.fault, pytest.mark.django_db(transaction=True)]

LONG = "mcp__tk__long_write"
POINT = "tool.after_remote_recorded"


@pytest.fixture
def tasks_http(tmp_path):
    """The tasks server over Streamable HTTP on loopback: yields (state, url, host:port)."""
    state = State(tmp_path / "tk-state")
    port = free_port()
    log = open(tmp_path / "tk-http.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, str(TASKS_SERVER), "--http", str(port)],
        cwd=ROOT,
        env={"MCP_TEST_STATE": str(state.path), "PATH": "/usr/bin:/bin"},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )

    def up():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return proc.poll() is not None

    wait_for(up, timeout=60, message="the tasks server to listen")
    assert proc.poll() is None, (tmp_path / "tk-http.log").read_text()
    yield state, f"http://127.0.0.1:{port}/mcp", f"127.0.0.1:{port}"
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    log.close()


def status(run):
    return Run.objects.filter(id=run.id).values_list("status", flat=True).get()


def test_a_worker_killed_while_its_task_runs_is_taken_over_by_polling_tasks_get_never_by_asking(
    cluster, procs, mcp_servers, tasks_http, load_agent, submit, tmp_path
):
    state, url, host = tasks_http
    spec = {"tk": {"url": url, "tools": {"long_write": "side_effect"}, "timeout_seconds": 30}}
    mcp_servers(spec, hosts=[host])  # this process publishes (and pins) with the same configuration
    load_agent(
        turns=[{"tool_calls": [{"name": LONG, "arguments": {"name": "once"}}]}, {"text": "done"}],
        tools=(LONG,),
        policy={"default": "allow"},
    )
    env = dict(
        AGENTRT_LEASE_SECONDS=2.0,
        AGENTRT_WORKERS=2,
        AGENTRT_ENABLE_FAULTPOINTS=1,
        AGENTRT_FAULTPOINTS=f"{POINT}=kill",
        AGENTRT_FAULTPOINT_DIR=tmp_path,
        AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=host,
        AGENTRT_MCP_SERVERS=json.dumps(spec),
    )
    c = cluster(**env)
    procs(["manage.py", "run_maintenance"], "maintenance", **env)
    run = submit()
    marker = tmp_path / f"{POINT}.{run.id}"
    wait_for(marker.exists, timeout=90, message=f"the worker to die after recording the task\n{c.output()[-3000:]}")
    inv = ToolInvocation.objects.get(run=run)
    (pending,) = inv.attempts  # committed before the worker died: the task id is in the record
    assert pending["outcome"] == "pending" and pending["remote"]["kind"] == "mcp_task"
    task_id = pending["remote"]["task_id"]
    assert state.effects() == []  # the job is still running
    state.touch("go")  # the job may finish now: whoever polls next sees it completed

    wait_for(lambda: status(run) not in ("QUEUED", "RUNNING"), timeout=120, message="the run to end")
    row = Run.objects.get(id=run.id)
    assert row.status == "COMPLETED", (row.status, row.failure, c.output()[-3000:])
    assert Event.objects.filter(run=run, type="lease.taken_over").exists()
    assert not Approval.objects.filter(run=run).exists()  # nobody was asked
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "completed" and inv.attempt == 1
    assert inv.result["content"][0]["text"] == "wrote once (task)"
    completed = Event.objects.get(run=run, type="tool.call.completed")
    assert completed.payload["via"] == "tasks/get" and completed.payload["task"] == task_id
    assert len(state.calls("long_write")) == 1  # the server never saw a second tools/call
    (effect,) = state.effects()
    assert effect["task"] == task_id and effect["key"] == inv.idempotency_key
    assert {g["task"] for g in state.lines("gets.jsonl")} == {task_id}
