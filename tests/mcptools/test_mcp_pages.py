"""People see an MCP call like any call (issue 36 item 7): the admin's approval page and its decision page show
the server, the tool and the server's hints labelled as hints; a server's text reaches them escaped."""

from __future__ import annotations

import pytest
from django.test import Client

from approvals.models import Approval
from runs.runtime.executor import run_drive
from tests.mcptools.fixtures import fx_stdio
from tests.mcptools.test_mcp_runs import WRITE, call

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def waiting(mcp_servers, fx_state, load_agent, submit):
    mcp_servers({"fx": fx_stdio(fx_state)})
    load_agent(
        turns=[call(WRITE, name="<b>bold</b>"), {"text": "done"}],
        tools=(WRITE,),
        policy={"default": "allow", "rules": [{"tool": WRITE, "decision": "require_approval"}]},
    )
    run = submit()
    run_drive(run_id=run.id)
    return Approval.objects.get(run=run)


def test_the_approval_shows_the_server_and_its_hints_as_hints_escaped(waiting, operator):
    shown = waiting.presentation
    assert shown["side_effect"] == "external_write" and shown["read_only"] is False  # ours
    assert shown["mcp"]["server_hints"]["readOnlyHint"] is True  # theirs, shown as a hint
    client = Client()
    client.force_login(operator)
    html = client.get(f"/admin/approvals/approval/{waiting.id}/change/").content.decode()
    assert "server fx, tool write" in html and "hints from the server, not trusted" in html
    assert "<script>alert(" not in html and "&lt;script&gt;alert(" in html
    assert "<b>bold</b>" not in html
    confirm = client.post(
        "/admin/approvals/approval/", {"action": "approve_selected", "_selected_action": [waiting.id]}
    ).content.decode()
    assert "MCP server fx, tool write" in confirm and "not trusted" in confirm
    assert "<script>alert(" not in confirm
