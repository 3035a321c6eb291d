"""Every model attempt is charged (issue 11 item 8, seed 002: "after" means
record): a failed or retried attempt's tokens and cost go into the ledger, so
`max_cost_usd` cannot be overrun by failures. Scripted provider, in-process,
on PostgreSQL."""

from __future__ import annotations

import pytest

from runs.models import Event, ModelCall, Run
from runs.runtime.executor import run_drive

pytestmark = pytest.mark.django_db(transaction=True)

SPENT = {"input_tokens": 1000, "output_tokens": 200, "cost_usd": 0.03}


def test_failed_attempts_count_against_the_cost_limit(load_agent, submit):
    load_agent(
        turns=[
            {
                "attempts": [
                    {"error": "transient", "stream_had_output": True, "usage": SPENT},
                    {"error": "transient", "stream_had_output": True, "usage": SPENT},
                    {"text": "done", "usage": {"input_tokens": 10, "output_tokens": 1, "cost_usd": 0.001}},
                ]
            }
        ],
        limits={"max_cost_usd": 0.05},
    )
    run = submit()
    run_drive(run_id=run.id)
    row = Run.objects.get(id=run.id)
    # The second failed attempt takes the run over its limit: it fails there,
    # and the third attempt is never made.
    assert row.status == "FAILED" and row.failure["reason"] == "budget_exceeded", (row.status, row.failure, row.usage)
    assert row.usage["cost_usd"] == pytest.approx(0.06)
    assert row.usage["input_tokens"] == 2000 and row.usage["output_tokens"] == 400 and row.usage["model_calls"] == 2
    calls = list(
        ModelCall.objects.filter(run=run)
        .order_by("attempt_number")
        .values_list("attempt_number", "status", "stream_had_output", "usage")
    )
    assert [(a, s, o) for a, s, o, _ in calls] == [(1, "failed", True), (2, "failed", True)]
    assert all(u["cost_usd"] == pytest.approx(0.03) and u["output_tokens"] == 200 for *_, u in calls)
    failed = list(Event.objects.filter(run=run, type="model.response.failed").values_list("payload", flat=True))
    assert [f["usage"]["cost_usd"] for f in failed] == [pytest.approx(0.03)] * 2


def test_a_retried_step_charges_every_attempt_it_made(load_agent, submit):
    load_agent(
        turns=[
            {
                "attempts": [
                    {"error": "transient", "stream_had_output": True, "usage": SPENT},
                    {"text": "done", "usage": {"input_tokens": 10, "output_tokens": 1, "cost_usd": 0.001}},
                ]
            }
        ],
        limits={"max_cost_usd": 1.0},
    )
    run = submit()
    run_drive(run_id=run.id)
    row = Run.objects.get(id=run.id)
    assert row.status == "COMPLETED" and row.final_message == "done"
    assert row.usage["cost_usd"] == pytest.approx(0.031)
    assert row.usage["input_tokens"] == 1010 and row.usage["output_tokens"] == 201 and row.usage["model_calls"] == 2
