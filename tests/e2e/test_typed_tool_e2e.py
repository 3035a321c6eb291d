"""A typed tool from a module named in AGENTRT_TOOL_MODULES, end to end
through a real `qcluster` (issue 13, "Evidence to show"): gated by a policy
`when` on one of its fields; invalid arguments are a failed result naming the
field and the function is not called; the approved call runs once with the
model instance and a non-empty idempotency key."""

from __future__ import annotations

import json
import sys

import pytest

from approvals.models import Approval
from approvals.services import approval_decide
from runs.models import Run, ToolInvocation
from runs.tools import REGISTRY
from tests.conftest import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def refunds():
    """This process validates the agent's tool list, so it registers the module too (as every process does)."""
    import tests.tool_modules.refunds  # noqa: F401

    yield
    REGISTRY.unregister("issue_refund")
    sys.modules.pop("tests.tool_modules.refunds", None)


def status(run):
    return Run.objects.filter(id=run.id).values_list("status", flat=True).get()


def test_a_typed_tool_from_a_configured_module_is_validated_gated_and_run_once(
    refunds, load_agent, submit, cluster, operator, tmp_path
):
    log = tmp_path / "refunds.jsonl"
    load_agent(
        name="refunder",
        turns=[
            {"tool_calls": [{"name": "issue_refund", "arguments": {"order_id": "ord_7", "amount_cents": "5000"}}]},
            {
                "tool_calls": [
                    {"name": "issue_refund", "arguments": {"order_id": "ord_7", "amount_cents": 5000, "reason": "torn"}}
                ]
            },
            {"text": "refunded"},
        ],
        tools=("issue_refund",),
        policy={
            "default": "allow",
            "rules": [
                {
                    "tool": "issue_refund",
                    "when": {"arg": "amount_cents", "op": "gt", "value": 1000},
                    "decision": "require_approval",
                }
            ],
        },
    )
    c = cluster(AGENTRT_TOOL_MODULES="tests.tool_modules.refunds", REFUNDS_LOG=str(log), AGENTRT_LEASE_SECONDS=5)
    run = submit(agent="refunder")
    wait_for(
        lambda: status(run) not in ("QUEUED", "RUNNING"),
        timeout=90,
        message=f"the run to park\n{c.output()[-3000:]}",
    )
    assert status(run) == "WAITING_FOR_APPROVAL", Run.objects.get(id=run.id).failure
    invalid = ToolInvocation.objects.get(run=run, step_number=1)
    assert invalid.status == "failed" and invalid.result["error"] == "schema_invalid"
    assert invalid.result["message"].startswith("amount_cents: Input should be a valid integer")
    assert not log.exists()  # the function did not run
    approval = Approval.objects.get(run=run, status="pending")
    assert approval.kind == "policy" and approval.presentation["arguments"]["amount_cents"] == 5000
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash, via="api")
    wait_for(lambda: status(run) == "COMPLETED", timeout=90, message=f"completion\n{c.output()[-3000:]}")
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    ran = ToolInvocation.objects.get(run=run, step_number=2)
    assert len(calls) == 1
    (call,) = calls
    assert call["type"] == "Refund" and call["args"] == {"order_id": "ord_7", "amount_cents": 5000, "reason": "torn"}
    assert call["idempotency_key"] and call["idempotency_key"] == ran.idempotency_key
    assert (call["run_id"], call["step"], call["attempt"], call["cancelled"]) == (str(run.id), 2, 1, False)
    assert ran.status == "completed"
    assert ran.result == {"refund_id": f"re_{ran.idempotency_key[:8]}", "order_id": "ord_7", "amount_cents": 5000}
    assert Run.objects.get(id=run.id).final_message == "refunded"
