"""The payments app's tools: found by agentrt at startup like `admin.py`.

`charge_card` is a typed side-effect tool. It journals the charge *before*
calling the gateway, under the invocation's idempotency key, and sends that
key to the gateway, which answers a repeated key with the first charge. When
the process dies while the call is in flight, `reconcile_charge` reads the
journal and the gateway and says what happened (seed 000):

* journaled, gateway never saw it → restore the row, `continue` (the agent
  sees the call interrupted and may ask again);
* journaled, gateway charged exactly that → `completed`, from the journal;
* gateway holds the charge for review → `waiting`: a person must look;
* gateway's charge differs from the journal, or exists unjournaled → `conflict`.

Tools are deployment-wide: every tenant's agents could name `charge_card`.
This gateway is one team's, so the tool charges only for runs of that
tenant: `PAYMENTS_TENANT` (a setting or the environment, like
`PAYMENTS_GATEWAY_URL`) names it, and a run of any other tenant — or any
run while it is unset — gets a failed result (`tenant_not_allowed` /
`payments_not_configured`) before anything is journaled or sent. The
platform operator can also keep the tool off other tenants' lists
(`create_tenant NAME --tools ...`).
"""

from __future__ import annotations

import os
from typing import Literal

import httpx
from django.conf import settings
from pydantic import BaseModel, Field

from runs.models import Tenant
from runs.runtime.faults import fire  # fault points for the kill tests; inert unless enabled
from runs.tools import OutcomeUnknown, Pause, Reconciliation, ToolExecutionContext, ToolFailure, register

# Relative: the app works under any package name (`cp -r examples/payments shop`).
from . import gateway
from .models import ChargeJournal


class Charge(BaseModel):
    """Charge a customer's card on file."""

    customer: str = Field(pattern=r"^cus_[A-Za-z0-9]{1,60}$", description="the customer id, cus_...")
    amount_cents: int = Field(gt=0, le=1_000_000, description="the amount in cents")
    currency: Literal["usd", "eur"] = "usd"


class Receipt(BaseModel):
    charge_id: str
    status: str
    amount_cents: int
    currency: str


def reconcile_charge(view, invocation: dict) -> Reconciliation:
    """Read the journal and the gateway; never charge again from here."""
    key = invocation["idempotency_key"]
    entry = ChargeJournal.objects.filter(idempotency_key=key).first()
    remote = gateway.lookup(key)
    if entry is None:
        if remote is None:
            return Reconciliation(outcome="continue")  # the tool never started
        return Reconciliation(outcome="conflict", detail=f"the gateway holds charge {remote['id']}, never journaled")
    if remote is None:
        entry.state = ChargeJournal.ABANDONED  # nothing happened outside: restore
        entry.save(update_fields=["state", "updated_at"])
        return Reconciliation(outcome="continue")
    if not entry.matches(remote):
        return Reconciliation(
            outcome="conflict",
            detail=f"charge {remote['id']} is for {remote['amount_cents']} {remote['currency']}, "
            f"the journal says {entry.amount_cents} {entry.currency}",
        )
    if remote["status"] == "pending_review":
        entry.state, entry.charge_id = ChargeJournal.PENDING, remote["id"]
        entry.save(update_fields=["state", "charge_id", "updated_at"])
        return Reconciliation(
            outcome="waiting",
            pause=Pause(
                capability={"tool": "charge_card", "idempotency_key": key},
                presentation={
                    "message": "the gateway holds this charge for review; approve once it is settled",
                    "charge_id": remote["id"],
                    "amount_cents": remote["amount_cents"],
                    "currency": remote["currency"],
                },
            ),
        )
    entry.state, entry.charge_id = ChargeJournal.SUCCEEDED, remote["id"]
    entry.save(update_fields=["state", "charge_id", "updated_at"])
    receipt = {"charge_id": remote["id"], "status": remote["status"], "amount_cents": entry.amount_cents}
    return Reconciliation(outcome="completed", result={**receipt, "currency": entry.currency})


def owner_tenant() -> str:
    """The name of the tenant whose cards this gateway charges ("" when unset)."""
    return getattr(settings, "PAYMENTS_TENANT", "") or os.environ.get("PAYMENTS_TENANT", "")


def check_tenant(ctx: ToolExecutionContext) -> None:
    """Refuse, as a failed result (nothing happened), a run of any tenant but
    the gateway's own: the run's principal carries the tenant it acts in."""
    owner = owner_tenant()
    if not owner:
        raise ToolFailure("payments_not_configured", "PAYMENTS_TENANT is not set: this gateway charges for no tenant")
    tenant_id = getattr(ctx.principal, "tenant_id", None)
    if tenant_id is None or not Tenant.objects.filter(id=tenant_id, name=owner).exists():
        raise ToolFailure("tenant_not_allowed", "this payment gateway belongs to another tenant; nothing was charged")


@register(
    name="charge_card",
    read_only=False,
    side_effect="external_write",
    timeout_seconds=20,
    reconciler=reconcile_charge,
)
def charge_card(args: Charge, ctx: ToolExecutionContext) -> Receipt:
    """Charge a customer's card; the same call (idempotency key) never charges twice."""
    check_tenant(ctx)  # before the journal: another tenant's run leaves no trace here
    entry, created = ChargeJournal.objects.get_or_create(
        idempotency_key=ctx.idempotency_key,
        defaults={
            "run_id": ctx.run_id,
            "customer": args.customer,
            "amount_cents": args.amount_cents,
            "currency": args.currency,
        },
    )
    if not created and (entry.customer, entry.amount_cents, entry.currency) != (
        args.customer,
        args.amount_cents,
        args.currency,
    ):
        raise ToolFailure("journal_mismatch", "this idempotency key was journaled for another charge")
    fire("payments.after_journal", ctx.run_id)
    if ctx.cancelled.is_set():
        raise ToolFailure("cancelled", "the run was cancelled before the gateway was called")
    try:
        charge = gateway.charge(
            ctx.idempotency_key,
            customer=args.customer,
            amount_cents=args.amount_cents,
            currency=args.currency,
            timeout=max(1.0, ctx.time_budget()),
        )
    except gateway.GatewayError as exc:  # the gateway answered: no charge
        raise ToolFailure("gateway_refused", str(exc)) from None
    except httpx.ConnectError:  # the request never left: definitely no charge
        raise ToolFailure("gateway_unreachable", "could not reach the payment gateway") from None
    except httpx.HTTPError as exc:  # sent, and no answer: it may have charged
        raise OutcomeUnknown("gateway_no_answer", f"the gateway did not answer ({type(exc).__name__})") from None
    fire("payments.after_charge", ctx.run_id)
    entry.state = ChargeJournal.PENDING if charge["status"] == "pending_review" else ChargeJournal.SUCCEEDED
    entry.charge_id = charge["id"]
    entry.save(update_fields=["state", "charge_id", "updated_at"])
    return Receipt(
        charge_id=charge["id"],
        status=charge["status"],
        amount_cents=charge["amount_cents"],
        currency=charge["currency"],
    )
