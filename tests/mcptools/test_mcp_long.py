"""Long MCP operations (issue 36 item 5), in-process on PostgreSQL (`run_drive`) against our own server
(tests/mcptools/tasks_server.py, the SDK's `MCPServer`, over stdio): a tool call answered with a task
(the Tasks extension) is polled with `tasks/get`, its task id in the call's record first; a server that
needs input suspends the run WAITING_FOR_USER with its question, and the answer — after the server process
and this process's client are gone — re-issues the request with `inputResponses` and the `requestState`;
progress notifications become throttled `tool.call.progress` events. The SIGKILL of a worker while a task
runs is tests/fault/test_mcp_task_kills.py."""

from __future__ import annotations

import sys

import pytest

from checkpoints.repository import checkpoint_latest
from runs.errors import InvalidInput
from runs.models import Event, Run, ToolInvocation
from runs.runtime.executor import run_drive
from runs.services.inputs import run_input
from runs.tools.mcp import client
from tests.mcptools import servers
from tests.mcptools.fixtures import State

pytestmark = pytest.mark.django_db(transaction=True)

LONG, ASK, PROGRESS = "mcp__tk__long_write", "mcp__tk__ask_then_write", "mcp__tk__progress_write"
TOOLS = {"long_write": "side_effect", "ask_then_write": "side_effect", "progress_write": "side_effect"}
ALLOW = {"default": "allow"}
TASKS_SERVER = servers.EFFECTS_SERVER.parent / "tasks_server.py"


def tasks_stdio(state: State, timeout: float = 20) -> dict:
    return {
        "command": [sys.executable, str(TASKS_SERVER)],
        "env": {"MCP_TEST_STATE": str(state.path)},
        "tools": TOOLS,
        "timeout_seconds": timeout,
    }


@pytest.fixture
def tk(mcp_servers, tmp_path):
    state = State(tmp_path / "tk-state")
    mcp_servers({"tk": tasks_stdio(state)})
    return state


def reload(run):
    return Run.objects.get(id=run.id)


def tool_messages(run):
    return [m for m in checkpoint_latest(run.id).conversation if m.get("role") == "tool"]


def call(tool, **arguments):
    return {"tool_calls": [{"name": tool, "arguments": arguments}]}


def test_a_call_answered_with_a_task_is_polled_and_the_tasks_result_is_the_calls(tk, load_agent, submit):
    tk.touch("go")  # the job completes at the first tasks/get
    load_agent(turns=[call(LONG, name="report"), {"text": "done"}], tools=(LONG,), policy=ALLOW)
    run = submit()
    run_drive(run_id=run.id)
    assert reload(run).status == "COMPLETED", reload(run).failure
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "completed" and inv.result["content"][0]["text"] == "wrote report (task)"
    (attempt,) = inv.attempts
    task = attempt["remote"]
    assert task["kind"] == "mcp_task" and task["server"] == "tk" and task["task_id"]
    assert tk.lines("gets.jsonl") and {g["task"] for g in tk.lines("gets.jsonl")} == {task["task_id"]}
    (sent,) = tk.calls("long_write")
    assert sent["key"] == inv.idempotency_key and "inline" not in sent  # answered with a task, not inline
    (effect,) = tk.effects()
    assert effect["task"] == task["task_id"]
    assert "wrote report (task)" in str(tool_messages(run)[0]["content"])


def test_a_task_still_running_when_time_is_up_keeps_its_id_and_is_polled_again_before_anyone_is_asked(
    tk, mcp_servers, load_agent, submit
):
    # The job never completes here: the call's time runs out. The task id is in the record, and the decision
    # path polls tasks/get once more before a person is asked.
    mcp_servers({"tk": tasks_stdio(tk, timeout=2)})
    load_agent(turns=[call(LONG, name="slow"), {"text": "done"}], tools=(LONG,), policy=ALLOW)
    run = submit()
    run_drive(run_id=run.id)
    row = reload(run)
    assert row.status == "WAITING_FOR_APPROVAL", (row.status, row.failure)
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "uncertain" and inv.result is None
    task_id = inv.attempts[-1]["remote"]["task_id"]
    assert inv.attempts[-1]["remote"]["kind"] == "mcp_task"
    assert len(tk.calls("long_write")) == 1  # never sent twice
    # Polled by the call, then again by the decision, before anyone was asked.
    assert len([g for g in tk.lines("gets.jsonl") if g["task"] == task_id]) >= 2


def test_a_server_question_waits_for_the_user_and_the_answer_reissues_the_request_across_processes(
    tk, load_agent, submit
):
    load_agent(turns=[call(ASK, name="branch"), {"text": "done"}], tools=(ASK,), policy=ALLOW)
    run = submit()
    run_drive(run_id=run.id)
    row = reload(run)
    assert row.status == "WAITING_FOR_USER", (row.status, row.failure)
    waiting = Event.objects.filter(run=run, type="run.waiting_for_user").latest("sequence")
    assert "Which colour should the branch be?" in waiting.payload["question"]
    asked = waiting.payload["tool_input"]
    assert asked["server"] == "tk" and asked["questions"][0]["fields"] == {"colour": "string"}
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "awaiting_approval" and inv.suspended_kind == "tool_input"
    remote = inv.attempts[-1]["remote"]
    assert remote["kind"] == "mcp_input" and remote["request_state"]  # the server's opaque state, kept
    assert tk.effects() == []  # nothing ran
    client.stop()  # this process's client and the server process are gone: the answer needs nothing of them

    with pytest.raises(InvalidInput) as bad:
        run_input(run=row, text='{"shade": "dark"}')  # no colour: refused, nothing changed
    assert "text" in bad.value.fields and reload(run).status == "WAITING_FOR_USER"

    run_input(run=row, text="red")
    run_drive(run_id=run.id)
    row = reload(run)
    assert row.status == "COMPLETED", (row.status, row.failure)
    (effect,) = tk.effects()
    assert effect["colour"] == "red" and effect["name"] == "branch"
    first, second = tk.calls("ask_then_write")
    assert first["answered"] is False and second["answered"] is True and second["state"] == "state-1"
    assert first["key"] == second["key"] == ToolInvocation.objects.get(run=run).idempotency_key
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "completed" and inv.attempt == 2
    assert [a["outcome"] for a in inv.attempts] == ["input_required", "succeeded"]
    assert "wrote branch in red" in str(tool_messages(run)[0]["content"])


def test_progress_notifications_become_throttled_progress_events(tk, load_agent, submit, settings):
    settings.AGENTRT_MCP_PROGRESS_INTERVAL_MS = 60_000  # one a minute: the first, then the last when it ends
    load_agent(turns=[call(PROGRESS, name="p", steps=30), {"text": "done"}], tools=(PROGRESS,), policy=ALLOW)
    run = submit()
    run_drive(run_id=run.id)
    assert reload(run).status == "COMPLETED"
    events = list(Event.objects.filter(run=run, type="tool.call.progress").order_by("sequence"))
    assert 1 <= len(events) <= 2, [e.payload for e in events]
    last = events[-1].payload
    assert last["progress"] == 30 and last["total"] == 30 and last["message"] == "step 30 of 30"
    inv = ToolInvocation.objects.get(run=run)
    assert last["invocation"] == str(inv.id) and last["tool"] == PROGRESS


def test_progress_unthrottled_writes_more_events(tk, load_agent, submit, settings):
    settings.AGENTRT_MCP_PROGRESS_INTERVAL_MS = 0
    load_agent(turns=[call(PROGRESS, name="p", steps=30), {"text": "done"}], tools=(PROGRESS,), policy=ALLOW)
    run = submit()
    run_drive(run_id=run.id)
    events = list(Event.objects.filter(run=run, type="tool.call.progress").order_by("sequence"))
    assert len(events) > 2  # 30 notifications 10 ms apart, drained every 50 ms
    assert [e.payload["progress"] for e in events] == sorted(e.payload["progress"] for e in events)
