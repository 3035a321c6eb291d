"""The principal end to end through a real `qcluster` (issue 15 §2): a run
acts for the user who submitted it — the tool in the worker process gets
`ctx.principal` — and a user deactivated while the run waits for approval
makes the resumed run fail `principal_revoked` before its tool runs."""

from __future__ import annotations

import json
import sys

import pytest
from django.contrib.auth import get_user_model

from approvals.models import Approval
from approvals.services import approval_decide
from runs.models import Run, ToolInvocation
from runs.tools import REGISTRY
from tests.conftest import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def whoami():
    """This process validates the agent's tool list, so it registers the module too (as every process does)."""
    import tests.tool_modules.whoami  # noqa: F401

    yield
    REGISTRY.unregister("whoami")
    sys.modules.pop("tests.tool_modules.whoami", None)


def status(run):
    return Run.objects.filter(id=run.id).values_list("status", flat=True).get()


def approve(run, operator):
    approval = Approval.objects.get(run=run, status="pending")
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash, via="api")


def test_the_principal_reaches_the_tool_and_a_deactivated_one_fails_the_run_at_resumption(
    whoami, load_agent, submit, cluster, operator, tmp_path
):
    log = tmp_path / "whoami.jsonl"
    load_agent(
        turns=[{"tool_calls": [{"name": "whoami", "arguments": {}}]}, {"text": "done"}],
        tools=("whoami",),
        policy={"default": "allow", "rules": [{"tool": "whoami", "decision": "require_approval"}]},
    )
    alice = get_user_model().objects.get(username="alice")
    c = cluster(AGENTRT_TOOL_MODULES="tests.tool_modules.whoami", WHOAMI_LOG=str(log), AGENTRT_LEASE_SECONDS=5)
    revoked = submit(text="for alice", principal=alice)
    wait_for(lambda: status(revoked) == "WAITING_FOR_APPROVAL", timeout=90, message=f"park\n{c.output()[-3000:]}")
    get_user_model().objects.filter(pk=alice.pk).update(is_active=False)
    approve(revoked, operator)
    wait_for(lambda: status(revoked) == "FAILED", timeout=90, message=f"the failure\n{c.output()[-3000:]}")
    row = Run.objects.get(id=revoked.id)
    assert row.failure["reason"] == "principal_revoked" and row.failure["error_class"] == "PrincipalRevoked"
    assert ToolInvocation.objects.get(run=revoked).status != "completed"
    assert not log.exists()  # the tool never ran for the revoked principal

    kept = submit(text="for the operator", principal=operator)
    wait_for(lambda: status(kept) == "WAITING_FOR_APPROVAL", timeout=90, message=f"park\n{c.output()[-3000:]}")
    approve(kept, operator)
    wait_for(lambda: status(kept) == "COMPLETED", timeout=90, message=f"completion\n{c.output()[-3000:]}")
    (seen,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert (seen["run_id"], seen["kind"], seen["username"]) == (str(kept.id), "user", "op")
    assert "approvals.resolve_approval" in seen["scopes"]
