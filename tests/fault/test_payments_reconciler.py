"""The worked example's reconciler (examples/payments) exercised by real
kills after the watermark (issue 13, "Evidence to show").

A real `qcluster` worker runs `charge_card`, which journals the charge and
calls a local fake gateway; the worker is SIGKILLed inside the tool, after the
journal row (`payments.after_journal`) or after the gateway answered
(`payments.after_charge`). A real `run_maintenance` process reclaims the run,
and Resume asks the tool's own reconciler (AGENTRT_RECONCILER is not set).
Each of its four answers leads where seed 000 says:

* nothing reached the gateway → `continue`: the agent sees the call
  interrupted and goes on; nothing was charged;
* the gateway charged exactly what was journaled → `completed`: the run
  completes with the receipt as its result, one charge;
* the gateway holds the charge for review → `waiting`: a `reconcile`
  approval; approved once settled, the same call runs again under the same
  idempotency key and the gateway answers the first charge (still one);
* the gateway's charge contradicts the journal → `conflict`: the run fails
  `reconcile_conflict`.
"""

from __future__ import annotations

import pytest

from approvals.models import Approval
from approvals.services import approval_decide
from examples.payments.fake_gateway import FakeGateway
from examples.payments.models import ChargeJournal
from runs.models import Event, Run, ToolInvocation
from tests.conftest import wait_for

pytestmark = [pytest.mark.fault, pytest.mark.django_db(transaction=True)]

LEASE = 2.0
CHARGE = {"customer": "cus_42", "amount_cents": 1250, "currency": "eur"}


@pytest.fixture
def gateway():
    g = FakeGateway().start()
    yield g
    g.close()


@pytest.fixture
def stack(cluster, gateway, tmp_path, procs):
    """A cluster whose worker dies at `point`, and a maintenance process that reclaims."""

    def start(point: str):
        env = dict(
            AGENTRT_LEASE_SECONDS=LEASE,
            AGENTRT_ENABLE_FAULTPOINTS=1,
            AGENTRT_FAULTPOINTS=f"{point}=kill",
            AGENTRT_FAULTPOINT_DIR=tmp_path,
            PAYMENTS_GATEWAY_URL=gateway.url,
            PAYMENTS_TENANT="acme",  # the suite's tenant: the gateway charges for it alone
        )
        c = cluster(**env)
        procs(["manage.py", "run_maintenance"], "maintenance", **env)
        return c

    return start


def payments_agent(load_agent):
    load_agent(
        name="cashier",
        turns=[{"tool_calls": [{"name": "charge_card", "arguments": CHARGE}]}, {"text": "charged"}],
        tools=("charge_card",),
    )


def status(run):
    return Run.objects.filter(id=run.id).values_list("status", flat=True).get()


def settled(run):
    wait_for(lambda: status(run) not in ("QUEUED", "RUNNING"), timeout=120, message="the run to leave RUNNING")
    return Run.objects.get(id=run.id)


def killed(tmp_path, point, run) -> bool:
    return (tmp_path / f"{point}.{run.id}").exists()


def test_nothing_reached_the_gateway_so_the_run_continues_and_nothing_is_charged(
    stack, load_agent, submit, gateway, tmp_path
):
    payments_agent(load_agent)
    stack("payments.after_journal")
    run = submit(agent="cashier")
    row = settled(run)
    assert killed(tmp_path, "payments.after_journal", run)
    assert row.status == "COMPLETED" and row.final_message == "charged", row.failure
    assert gateway.posts == [] and gateway.charges == {}
    (entry,) = ChargeJournal.objects.all()
    assert entry.state == ChargeJournal.ABANDONED  # restored: the gateway never saw it
    inv = ToolInvocation.objects.get(run=run, tool_name="charge_card")
    assert inv.status == "interrupted" and inv.result["error"] == "interrupted"  # what the agent was shown
    assert Event.objects.filter(run=run, type="lease.taken_over").exists()
    assert not Approval.objects.filter(run=run).exists()


def test_the_gateway_charged_what_was_journaled_so_the_run_completes_from_the_journal(
    stack, load_agent, submit, gateway, tmp_path
):
    payments_agent(load_agent)
    stack("payments.after_charge")
    run = submit(agent="cashier")
    row = settled(run)
    assert killed(tmp_path, "payments.after_charge", run)
    assert row.status == "COMPLETED", row.failure
    assert row.result == {"charge_id": "ch_1", "status": "succeeded", "amount_cents": 1250, "currency": "eur"}
    assert len(gateway.posts) == 1 and len(gateway.charges) == 1
    assert ChargeJournal.objects.get().state == ChargeJournal.SUCCEEDED


def test_a_charge_held_for_review_waits_for_a_person_and_the_approved_rerun_charges_once(
    stack, load_agent, submit, gateway, tmp_path, operator
):
    payments_agent(load_agent)
    gateway.mode = "review"
    stack("payments.after_charge")
    run = submit(agent="cashier")
    row = settled(run)
    assert row.status == "WAITING_FOR_APPROVAL", row.failure
    approval = Approval.objects.get(run=run, status="pending")
    assert approval.kind == "reconcile" and approval.presentation["charge_id"] == "ch_1"
    (key,) = gateway.charges
    assert ToolInvocation.objects.get(run=run, tool_name="charge_card").idempotency_key == key
    gateway.settle(key)
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash, via="api")
    wait_for(lambda: status(run) == "COMPLETED", timeout=90, message="completion after the approval")
    assert [p["key"] for p in gateway.posts] == [key, key] and len(gateway.charges) == 1  # sent again, charged once
    inv = ToolInvocation.objects.get(run=run, tool_name="charge_card")
    assert inv.status == "completed" and inv.result["status"] == "succeeded"
    assert Run.objects.get(id=run.id).final_message == "charged"


def test_a_gateway_charge_that_contradicts_the_journal_is_a_conflict(stack, load_agent, submit, gateway, tmp_path):
    payments_agent(load_agent)
    gateway.mode = "tamper"
    stack("payments.after_charge")
    run = submit(agent="cashier")
    row = settled(run)
    assert row.status == "FAILED"
    assert row.failure["reason"] == "reconcile_conflict"
    assert "1251 eur" in row.failure["message"] and "1250 eur" in row.failure["message"]
    assert len(gateway.posts) == 1
