"""`agent_mcp_calls_total{server,tool,outcome}` on `/metrics` (issue 36 item 7): counted from the calls' result
events, once per attempt that ran, the same before and after the metrics sweep folds the ended runs; read
through a partial index no other event writes to."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client

from ops import fleet
from runs.runtime.executor import run_drive
from tests.mcptools.fixtures import fx_stdio
from tests.mcptools.test_mcp_runs import call
from tests.ops.test_metrics_cluster import samples, value

pytestmark = pytest.mark.django_db(transaction=True)


def scrape() -> dict:
    response = Client(HTTP_HOST="127.0.0.1").get("/metrics")
    assert response.status_code == 200
    return samples(response.content.decode())


def test_each_mcp_call_that_ran_is_counted_by_server_tool_and_outcome(mcp_servers, fx_state, load_agent, submit):
    mcp_servers({"fx": fx_stdio(fx_state)})
    load_agent(
        turns=[
            call("mcp__fx__echo", text="a"),
            call("mcp__fx__echo", text="b"),
            call("mcp__fx__fail"),
            call("mcp__fx__write", name=7),  # refused by the pinned schema: never ran, not counted
            call("echo", text="not mcp"),
            call("mcp__fx__write_then_die", name="x"),
            {"text": "done"},
        ],
        tools=("mcp__fx__echo", "mcp__fx__fail", "mcp__fx__write", "mcp__fx__write_then_die", "echo"),
    )
    run = submit()
    run_drive(run_id=run.id)
    m = scrape()
    assert value(m, "agent_mcp_calls_total", server="fx", tool="echo", outcome="succeeded") == 2
    assert value(m, "agent_mcp_calls_total", server="fx", tool="fail", outcome="failed") == 1
    assert value(m, "agent_mcp_calls_total", server="fx", tool="write_then_die", outcome="uncertain") == 1
    counted = {k: v for k, v in m.items() if k[0] == "agent_mcp_calls_total"}
    assert sum(counted.values()) == 4 and not any(("tool", "write") in k[1] for k in counted)
    assert value(m, "agent_tool_uncertain_total", tool="mcp__fx__write_then_die") == 1


def test_the_figures_survive_the_fold(mcp_servers, fx_state, load_agent, submit):
    mcp_servers({"fx": fx_stdio(fx_state)})
    load_agent(turns=[call("mcp__fx__echo", text="a"), {"text": "done"}], tools=("mcp__fx__echo",))
    run = submit()
    run_drive(run_id=run.id)
    before = fleet.deployment_counters()["mcp_calls"]
    assert before == {"mcp__fx__echo succeeded": 1}
    while fleet.fold(batch=10, settled_seconds=0):
        pass
    assert fleet.deployment_counters()["mcp_calls"] == before


def test_the_per_run_read_uses_its_partial_index():
    with connection.cursor() as cur:
        cur.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'events_mcp_calls_idx'")
        (definition,) = cur.fetchone()
        assert "mcp" in definition
        cur.execute("SET enable_seqscan = off")
        sql = f"EXPLAIN SELECT x.payload FROM events x WHERE x.run_id = %s AND {fleet.MCP_CALLS}"
        cur.execute(sql, ["00000000-0000-0000-0000-000000000000"])
        plan = "\n".join(r[0] for r in cur.fetchall())
        cur.execute("RESET enable_seqscan")
    assert "events_mcp_calls_idx" in plan, plan
