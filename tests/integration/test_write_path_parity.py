"""The step's two write paths write the same rows (DESIGN §6): the same units
of work committed statement by statement on one run and as one-statement CTEs
on another run, on PostgreSQL, leave the same rows in runs, events,
model_calls, tool_invocations, approvals and checkpoints — every column, once
the ids that name each run's own rows are replaced by the same symbols.

The only columns left out are the ones a run's own claim stamps with the
database clock (`lease_expires_at`) or its submission does (`created_at`,
`deadline_at`), the events' serial `id` and the time of the two events
written before the units (`run.created`, `run.claimed`), and the id and
time of the checkpoint written at submission; everything a unit writes carries the unit's own timestamps, so those
are compared too."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.models import Approval
from checkpoints.models import Checkpoint
from runs.clock import CLOCK
from runs.domain.writes import (
    ApprovalInsert,
    CheckpointInsert,
    InvocationInsert,
    InvocationUpdate,
    ModelCallFinish,
    ModelCallInsert,
    Transition,
    UnitOfWork,
)
from runs.models import Event, ModelCall, Run, ToolInvocation
from runs.runtime.queue import run_claim
from runs.store import repository
from runs.store.pg import can_batch
from runs.store.repository import DjangoRunStore

pytestmark = pytest.mark.django_db(transaction=True)

T0 = CLOCK.now().replace(microsecond=0)
ONE_STATEMENT = "WITH fenced_run AS ("


def ids_of(run_id: uuid.UUID) -> dict[str, uuid.UUID]:
    """Each run's own ids for the same symbolic rows."""
    return {name: uuid.uuid5(run_id, name) for name in ("model_call_1", "model_call_2", "read", "effect", "approval")}


def units(run_id: uuid.UUID, ending: str) -> tuple[list[UnitOfWork], Transition]:
    """Two steps and a parking-free finalize, as the loop and finalize write
    them; each unit one the one-statement path can batch (no row inserted and
    updated in the same unit)."""
    ids = ids_of(run_id)
    at = [T0 + timedelta(seconds=n) for n in range(10)]
    step1 = UnitOfWork(usage={"input_tokens": 10, "output_tokens": 2, "cost_usd": 0.5}, step_count=1)
    step1.model_call_inserts.append(
        ModelCallInsert(id=ids["model_call_1"], step_number=1, attempt_number=1, started_at=at[0])
    )
    step1.event("model.request.started", {"step": 1, "attempt": 1, "é": "ü"}, at[0])

    step2 = UnitOfWork(usage={"input_tokens": 20, "output_tokens": 5, "cost_usd": 1.25}, step_count=1)
    step2.model_call_finishes.append(
        ModelCallFinish(
            id=ids["model_call_1"],
            status="completed",
            usage={"input_tokens": 10, "output_tokens": 3},
            stop_reason="tool_use",
            stream_had_output=True,
            error=None,
            prefix_sha256="ab" * 32,
            finished_at=at[1],
        )
    )
    for name, index, read_only, status in (("read", 0, True, "authorized"), ("effect", 1, False, "awaiting_approval")):
        step2.invocation_inserts.append(
            InvocationInsert(
                id=ids[name],
                step_number=1,
                call_index=index,
                call_id=f"call_1_{index}",
                tool_name="echo" if read_only else "http_post",
                arguments={"text": "hi", "nested": [1, {"a": None}]},
                raw_arguments='{"text": "hi"}',
                idempotency_key=f"{run_id}:1:{index}",
                status=status,
                read_only=read_only,
                side_effect="none" if read_only else "external",
                result=None,
                error={"error": "earlier"} if read_only else None,
                created_at=at[1],
                suspended_kind=None if read_only else "approval",
                outcome=None,
            )
        )
    step2.approval_inserts.append(
        ApprovalInsert(
            id=ids["approval"],
            invocation_id=ids["effect"],
            kind="policy",
            request_hash="f" * 64,
            capability={"tool": "http_post", "url": "http://x.invalid/"},
            presentation={"title": "Post", "body": {"k": "v"}},
            expires_at=at[9],
            created_at=at[1],
        )
    )
    step2.model_call_inserts.append(
        ModelCallInsert(id=ids["model_call_2"], step_number=2, attempt_number=1, started_at=at[2])
    )
    step2.checkpoint = CheckpointInsert(
        version=2, full=False, base_version=1, trigger="step", state={"conversation": ["a", {"b": 1}]}, created_at=at[2]
    )
    step2.event("tool.call.proposed", {"invocation": str(ids["read"])}, at[1])
    step2.event("run.checkpointed", {"version": 2}, at[2])

    step3 = UnitOfWork(usage={"input_tokens": 30, "output_tokens": 9, "cost_usd": 2.0}, step_count=2)
    step3.invocation_updates += [
        InvocationUpdate(
            id=ids["read"],
            status="completed",
            result={"echo": "hi"},
            attempt=1,
            updated_at=at[3],
            outcome="succeeded",
            attempts=[{"attempt": 1, "outcome": "succeeded"}],
            clear_error=True,
        ),
        InvocationUpdate(id=ids["effect"], status="failed", error={"error": "rejected"}, updated_at=at[3]),
    ]
    step3.model_call_finishes.append(
        ModelCallFinish(
            id=ids["model_call_2"],
            status="failed",
            usage={},
            stop_reason=None,
            stream_had_output=False,
            error={"error_class": "Timeout", "message": "slow"},
            prefix_sha256=None,
            finished_at=at[4],
        )
    )
    step3.checkpoint = CheckpointInsert(
        version=3, full=True, base_version=None, trigger="final", state={"conversation": ["c"]}, created_at=at[4]
    )
    step3.event("tool.call.completed", {"invocation": str(ids["read"]), "result": {"echo": "hi"}}, at[3])
    step3.event("run.completed" if ending == "completed" else "run.failed", {"lease_epoch": 1}, at[4])
    if ending == "completed":
        transition = Transition(
            status="COMPLETED", release_lease=True, final_message="done ✓", result={"answer": [1, 2]}
        )
    else:
        transition = Transition(
            status="FAILED", release_lease=True, failure={"reason": "budget_exceeded", "details": {"steps": 2}}
        )
    return [step1, step2, step3], transition


def write(run, *, one_statement: bool, ending: str, monkeypatch) -> list[str]:
    """Commit the units on `run` through one path; return the SQL sent."""
    claim = run_claim(run_id=run.id, owner="worker-parity")
    store = DjangoRunStore(
        run_id=run.id,
        tenant_id=run.tenant_id,
        session_id=run.session_id,
        owner=claim.owner,
        epoch=claim.epoch,
        code_version="v-parity",
    )
    work, transition = units(run.id, ending)
    assert all(can_batch(unit) for unit in work)
    with monkeypatch.context() as patch, CaptureQueriesContext(connection) as sent:
        if not one_statement:
            patch.setattr(repository, "can_batch", lambda unit: False)
        for unit in work[:-1]:
            store.commit(unit)
        work[-1].transition = transition
        store.commit(work[-1])
    return [q["sql"] for q in sent.captured_queries]


def normalised(value: Any, symbols: dict[str, str]) -> Any:
    """Replace every id of the run's own rows (as UUID or text, also inside
    strings such as idempotency keys) with its symbol."""
    if isinstance(value, uuid.UUID):
        return symbols.get(str(value), value)
    if isinstance(value, str):
        for raw, symbol in symbols.items():
            value = value.replace(raw, symbol)
        return value
    if isinstance(value, dict):
        return {k: normalised(v, symbols) for k, v in value.items()}
    if isinstance(value, list):
        return [normalised(v, symbols) for v in value]
    return value


def rows(run) -> dict[str, list[dict[str, Any]]]:
    symbols = {str(v): k for k, v in ids_of(run.id).items()}
    symbols[str(run.id)] = "run"
    symbols[str(run.session_id)] = "session"
    for version in (2, 3):
        symbols[str(repository._checkpoint_id(run.id, version))] = f"checkpoint_{version}"
    tables = {
        "runs": Run.objects.filter(id=run.id).values(),
        "events": Event.objects.filter(run_id=run.id).order_by("sequence").values(),
        "model_calls": ModelCall.objects.filter(run_id=run.id).order_by("step_number").values(),
        "tool_invocations": ToolInvocation.objects.filter(run_id=run.id).order_by("call_index").values(),
        "approvals": Approval.objects.filter(run_id=run.id).values(),
        "checkpoints": Checkpoint.objects.filter(run_id=run.id).order_by("version").values(),
    }
    left_out = {"runs": {"created_at", "deadline_at", "lease_expires_at"}, "events": {"id"}}
    out = {}
    for table, queryset in tables.items():
        out[table] = [
            {k: normalised(v, symbols) for k, v in row.items() if k not in left_out.get(table, set())}
            for row in queryset
        ]
    first_checkpoint = out["checkpoints"][0]
    assert first_checkpoint["version"] == 1  # submission's, not the units'
    del first_checkpoint["id"], first_checkpoint["created_at"]
    for event in out["events"]:
        if event["type"] in ("run.created", "run.claimed"):  # written at submission and claim, not by the units
            del event["occurred_at"]
    return out


@pytest.mark.parametrize("ending", ["completed", "failed"])
def test_both_write_paths_write_the_same_rows(load_agent, submit, monkeypatch, ending):
    load_agent()
    by_statement, one_statement = submit(text="parity"), submit(text="parity")

    statements = write(by_statement, one_statement=False, ending=ending, monkeypatch=monkeypatch)
    ctes = write(one_statement, one_statement=True, ending=ending, monkeypatch=monkeypatch)

    assert not any(ONE_STATEMENT in sql for sql in statements)
    assert sum(ONE_STATEMENT in sql for sql in ctes) == 3  # each unit was one statement
    first, second = rows(by_statement), rows(one_statement)
    for table in first:
        assert len(first[table]) == len(second[table]), table
        differing = [
            {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)}
            for a, b in zip(first[table], second[table], strict=True)
        ]
        assert not any(differing), (table, differing)
    run = first["runs"][0]
    assert run["status"] == ending.upper()
    assert (run["lease_owner"], run["step_count"], run["usage"]["cost_usd"]) == (None, 2, 2.0)
    assert (run["final_message"] is None) is (ending == "failed")
    assert [len(first[t]) for t in ("model_calls", "tool_invocations", "approvals", "checkpoints")] == [2, 2, 1, 3]
    assert first["tool_invocations"][0]["error"] is None  # clear_error, on both paths
    assert first["tool_invocations"][1]["suspended_kind"] == "approval"  # kept where the update names none
