"""Real MCP servers from PyPI (issue 36), installed into a venv of their own as a user would (tests/mcptools/
servers.py): `mcp-server-time` read-only; `mcp-server-git` on a scratch repository — `git_status` runs,
`git_create_branch` waits for approval, then makes the branch once."""

from __future__ import annotations

import os
import subprocess

import pytest

from approvals.models import Approval
from approvals.services import approval_decide
from runs.models import Run, ToolInvocation
from runs.runtime.executor import run_drive
from tests.mcptools import servers
from tests.mcptools.test_mcp_runs import call, reload, tool_messages

pytestmark = pytest.mark.django_db(transaction=True)

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "HOME": "/nonexistent",
}


@pytest.fixture
def repo(tmp_path):
    path = tmp_path / "scratch-repo"
    path.mkdir()
    env = {**os.environ, **GIT_ENV}
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "first"]):
        subprocess.run(["git", *args], cwd=path, env=env, check=True)
    return path


def branches(repo) -> list[str]:
    out = subprocess.run(["git", "branch", "--format=%(refname:short)"], cwd=repo, check=True, capture_output=True)
    return sorted(out.stdout.decode().split())


@pytest.fixture
def git(mcp_servers, mcp_venv, repo):
    mcp_servers(
        {
            "git": {
                "command": [servers.bin_path("mcp-server-git"), "--repository", str(repo)],
                "env": GIT_ENV,
                "env_from": ["PATH"],  # the server runs git: the one variable of ours it is given
                "tools": {"git_status": "read_only", "git_create_branch": "side_effect"},
                "timeout_seconds": 20,
            },
            "time": {"command": [servers.bin_path("mcp-server-time")], "tools": {"get_current_time": "read_only"}},
        }
    )
    return repo


def test_mcp_server_time_answers_a_read_only_call(git, load_agent, submit):
    load_agent(
        turns=[call("mcp__time__get_current_time", timezone="Etc/UTC"), {"text": "done"}],
        tools=("mcp__time__get_current_time",),
    )
    run = submit()
    run_drive(run_id=run.id)
    assert reload(run).status == "COMPLETED"
    inv = ToolInvocation.objects.get(run=run)
    assert inv.read_only and inv.outcome == "succeeded" and "Etc/UTC" in str(inv.result)


def test_git_status_runs_and_git_create_branch_waits_for_approval_then_makes_the_branch_once(
    git, load_agent, submit, operator
):
    repo = git
    version = load_agent(
        turns=[
            call("mcp__git__git_status", repo_path=str(repo)),
            call("mcp__git__git_create_branch", repo_path=str(repo), branch_name="agent-branch"),
            {"text": "branched"},
        ],
        tools=("mcp__git__git_status", "mcp__git__git_create_branch"),
        policy={"default": "allow", "rules": [{"tool": "mcp__git__git_create_branch", "decision": "require_approval"}]},
    )
    # git's own annotations say git_create_branch is not read-only; ours say so too — ours decide.
    assert version.definition["mcp_tools"]["mcp__git__git_create_branch"]["annotations"]["readOnlyHint"] is False
    run = submit()
    run_drive(run_id=run.id)
    row = reload(run)
    assert row.status == "WAITING_FOR_APPROVAL"
    status = ToolInvocation.objects.get(run=run, tool_name="mcp__git__git_status")
    assert status.outcome == "succeeded" and "On branch main" in str(status.result)
    assert branches(repo) == ["main"]  # nothing created before the decision
    approval = Approval.objects.get(run=run, status="pending")
    shown = approval.presentation
    assert shown["tool"] == "mcp__git__git_create_branch" and shown["side_effect"] == "external_write"
    assert shown["arguments"] == {"repo_path": str(repo), "branch_name": "agent-branch"}
    assert shown["mcp"] == {
        "server": "git",
        "tool": "git_create_branch",
        "server_hints": {
            "readOnlyHint": False,
            "destructiveHint": False,
            "idempotentHint": False,
            "openWorldHint": False,
        },
        "note": shown["mcp"]["note"],
    }
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash, via="api")
    run_drive(run_id=run.id)
    assert Run.objects.get(id=run.id).status == "COMPLETED"
    assert branches(repo) == ["agent-branch", "main"]
    create = ToolInvocation.objects.get(run=run, tool_name="mcp__git__git_create_branch")
    assert create.attempt == 1 and create.outcome == "succeeded" and create.effect_sent_at is not None
    assert any("agent-branch" in m["content"] for m in tool_messages(run))
