"""README's webhook payloads ("Hooks and webhooks", **Payloads.**) against
real bodies: the object shown there and the table per type are read from the
README text, and the bodies a real receiver got for every type are checked
against them — each carries every field listed without `?` and none that is
not listed (an optional field need not appear: a running run's cancel and a
confirmation are not produced here). Doctored copies of the README are
checked too: a field dropped, a phantom field, a link dropped, an envelope
key dropped must each be reported."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import timedelta

import pytest

from runs.runtime.executor import run_drive
from tests.conftest import ROOT
from webhooks.delivery import deliver
from webhooks.models import EVENT_TYPES, TEST_EVENT, Delivery

from .conftest import approver_agent, subscribe

pytestmark = pytest.mark.django_db(transaction=True)

README = ROOT / "docs" / "webhooks.md"  # the webhooks page of the documentation


# -- what the README says -------------------------------------------------------------------------


@dataclass
class Row:
    required: set[str] = field(default_factory=set)
    optional: set[str] = field(default_factory=set)
    nested: dict[str, set[str]] = field(default_factory=dict)  # `failure` (`{reason, ...}`)
    data: set[str] = field(default_factory=set)  # `data.X` named in "also"
    links: set[str] = field(default_factory=set)  # `links.X` named in "also"
    has_event: bool = True  # False: the event column is "—" (no run, no event)


def section(text: str) -> str:
    start = text.index("**Payloads.**")
    end = text.find("\n## ", start)
    return text[start : end if end != -1 else len(text)]


def envelope(text: str) -> dict:
    """The object shown after **Payloads.**: key -> {"optional": bool, "keys": nested dict or None}."""
    lines = section(text).splitlines()[1:]
    block = []
    for line in lines:
        if line.startswith("    "):
            block.append(line.strip())
        elif block:
            break
    root: dict = {}
    stack: list[dict] = []
    last = None
    for m in re.finditer(r'"(\w+)"(\?)?:|[{}]', " ".join(block)):
        if m.group(1):
            last = m.group(1)
            stack[-1][last] = {"optional": bool(m.group(2)), "keys": None}
        elif m.group(0) == "{":
            if not stack:
                stack.append(root)
            else:
                child: dict = {}
                stack[-1][last]["keys"] = child
                stack.append(child)
        else:
            stack.pop()
    return root


def _strip_parentheses(cell: str) -> str:
    while True:
        stripped = re.sub(r"\([^()]*\)", "", cell)
        if stripped == cell:
            return cell
        cell = stripped


def table(text: str) -> dict[str, Row]:
    rows: dict[str, Row] = {}
    lines = section(text).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| type |"))
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        kind, event, also = (c.strip() for c in line.strip().strip("|").split("|"))
        row = Row(has_event=not event.startswith("—"))
        for m in re.finditer(r"`(\w+)`\??\s*\(`\{([^}]*)\}`\)", event):
            row.nested[m.group(1)] = {k.strip() for k in m.group(2).split(",")}
        for m in re.finditer(r"`(\w+)`(\?)?", _strip_parentheses(event)):
            (row.optional if m.group(2) else row.required).add(m.group(1))
        row.data = set(re.findall(r"`data\.(\w+)", also))
        row.links = set(re.findall(r"`links\.(\w+)", also))
        rows[kind.strip("`")] = row
    return rows


def mismatches(text: str, bodies: dict[str, list[dict]]) -> list[str]:
    """What the bodies carry that the README does not say, or lack that it does."""
    shape, rows = envelope(text), table(text)
    out = []
    if set(rows) != set(bodies):
        out.append(f"the table's types {sorted(rows)} are not the types sent {sorted(bodies)}")
    top = {k for k, v in shape.items() if not v["optional"]}
    data_shape = shape.get("data", {}).get("keys") or {}
    data_always = {k for k, v in data_shape.items() if not v["optional"]}
    event_keys = set(data_shape.get("event", {}).get("keys") or {})
    link_keys = set(shape.get("links", {}).get("keys") or {})
    for kind, sent in sorted(bodies.items()):
        row = rows.get(kind)
        if row is None:
            continue
        if row.has_event and (unknown := row.data - set(data_shape)):
            out.append(f"{kind}: the table names data.{sorted(unknown)}, not in the object shown")
        for body in sent:
            if set(body) != top:
                out.append(f"{kind}: the body's keys {sorted(body)}, the README's {sorted(top)}")
            data, links = body.get("data", {}), body.get("links", {})
            want_data = (data_always | (row.data & set(data_shape))) if row.has_event else row.data
            if set(data) != want_data:
                out.append(f"{kind}: data carries {sorted(data)}, the README says {sorted(want_data)}")
            want_links = (link_keys | row.links) if row.has_event else row.links
            if set(links) != want_links:
                out.append(f"{kind}: links carries {sorted(links)}, the README says {sorted(want_links)}")
            if not row.has_event:
                continue
            event = data.get("event") or {}
            if set(event) != event_keys:
                out.append(f"{kind}: data.event carries {sorted(event)}, the README says {sorted(event_keys)}")
            payload = event.get("payload") or {}
            if missing := row.required - set(payload):
                out.append(f"{kind}: the README lists {sorted(missing)}, the payload lacks them")
            if extra := set(payload) - row.required - row.optional:
                out.append(f"{kind}: the payload carries {sorted(extra)}, not in the README's table")
            for name, keys in row.nested.items():
                if isinstance(payload.get(name), dict) and set(payload[name]) != keys:
                    out.append(f"{kind}: {name} carries {sorted(payload[name])}, the README says {sorted(keys)}")
    return out


# -- real bodies ---------------------------------------------------------------------------------


def real_bodies(tenant, load_agent, submit, manager, operator, receiver) -> dict[str, list[dict]]:
    """At least one real body of every type, as a receiver got them."""
    from approvals.models import Approval
    from approvals.services import approval_decide
    from maintenance.sweeps.expiry import sweep_expiry
    from runs.runtime.queue import db_now
    from runs.services.lifecycle import run_cancel
    from webhooks.services import send_test

    sub, _ = subscribe(manager, receiver.url, list(EVENT_TYPES))
    load_agent()  # completes
    run_drive(run_id=submit().id)
    load_agent(name="broken", turns=[{"error": "permanent"}])  # fails in its worker
    run_drive(run_id=submit(agent="broken").id)
    run_cancel(run=submit(text="never run"), by="alice")  # cancelled while queued
    approver_agent(load_agent)  # waits for approval; approved
    approved = submit(agent="payer")
    run_drive(run_id=approved.id)
    approval = Approval.objects.get(run_id=approved.id)
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash)
    expiring = submit(agent="payer")  # waits for approval; expires: a waiting run fails
    run_drive(run_id=expiring.id)
    Approval.objects.filter(run_id=expiring.id).update(expires_at=db_now() - timedelta(seconds=1))
    assert sweep_expiry()["approval_expired"] == 1
    load_agent(
        name="asker",
        tools=["ask_user"],
        turns=[{"tool_calls": [{"name": "ask_user", "arguments": {"question": "Which region?"}}]}, {"text": "ok"}],
    )
    run_drive(run_id=submit(agent="asker").id)  # waits for its user
    send_test(user=manager, subscription_id=sub.id)
    for d in Delivery.objects.filter(status="pending", kind="webhook").order_by("created_at"):
        assert deliver(d.id) == "succeeded"
    bodies: dict[str, list[dict]] = {}
    for r in receiver.requests:
        body = json.loads(r["body"])
        bodies.setdefault(body["type"], []).append(body)
    return bodies


def test_every_event_types_real_payload_carries_exactly_the_fields_the_readme_lists(
    tenant, load_agent, submit, manager, operator, receiver
):
    bodies = real_bodies(tenant, load_agent, submit, manager, operator, receiver)
    assert set(bodies) == {*EVENT_TYPES, TEST_EVENT}
    decisions = {b["data"]["event"]["payload"]["decision"] for b in bodies["approval.resolved"]}
    assert decisions == {"approved", "expired"}
    assert len(bodies["run.failed"]) == 2  # one failed in its worker, one failed waiting
    text = README.read_text()
    rows = table(text)
    assert set(rows) == {*EVENT_TYPES, TEST_EVENT} and rows["run.completed"].required  # the table was read
    assert envelope(text)["data"]["keys"]["approval"]["optional"] is True  # ... and the object
    assert mismatches(text, bodies) == []

    # Planted: each doctored copy of the README must be reported.
    def doctored(old: str, new: str) -> list[str]:
        assert old in text, old
        return mismatches(text.replace(old, new, 1), bodies)

    completed_row = "| `run.completed` | `lease_epoch`, `final_message`, "
    assert "run.completed: the payload carries ['final_message'], not in the README's table" in doctored(
        completed_row, "| `run.completed` | `lease_epoch`, "
    )
    assert "run.failed: the README lists ['nonsense'], the payload lacks them" in doctored(
        "| `run.failed` | `failure`", "| `run.failed` | `nonsense`, `failure`"
    )
    assert any(
        m.startswith("run.failed: failure carries")
        for m in doctored("attempt_number, occurred_at, details}", "attempt_number, occurred_at}")
    )
    assert any(m.startswith("approval.requested: links carries") for m in doctored(", `links.approval` |", " |"))
    assert any(m.startswith("run.completed: the body's keys") for m in doctored('"tenant": "<tenant name>",', ""))
    assert any(m.startswith("webhook.test: data carries") for m in doctored("and `data.sent_by` (who sent it)", ""))
