"""Retention (maintenance/retention.py): the ended runs of a tenant last
written before the cutoff lose their detail — events, tool invocations,
approvals, model calls, checkpoints, finished deliveries — a batch at a
time, by the retention sweep (AGENTRT_RETENTION_DAYS) and by
`manage.py purge_runs`; the run row stays with its final message and usage;
a run that has not ended keeps everything, however old; each statement reads
through an index on tables big enough for the planner to prefer one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from approvals.models import Approval
from checkpoints.models import Checkpoint
from maintenance import retention
from maintenance.sweeps.metrics import sweep_metrics
from maintenance.sweeps.retention import sweep_retention
from runs.errors import RunNotForkable, RunNotRetryable
from runs.models import Event, ModelCall, Run, Tenant, ToolInvocation
from runs.runtime.executor import run_drive
from runs.runtime.queue import db_now
from runs.runtime.retry import run_retry
from runs.services import run_submit, tenant_create
from runs.services.lineage import run_fork
from tests.conftest import ROOT, race, subprocess_env
from webhooks.models import Delivery

pytestmark = pytest.mark.django_db(transaction=True)

TOOL_TURNS = [{"tool_calls": [{"name": "echo", "arguments": {"text": str(i)}}]} for i in range(3)] + [
    {"text": "all echoed"}
]
ASK_FOR_ECHO = {"default": "allow", "rules": [{"tool": "echo", "decision": "require_approval"}]}


def detail(run) -> dict[str, int]:
    return {
        "events": Event.objects.filter(run_id=run.id).count(),
        "tool_invocations": ToolInvocation.objects.filter(run_id=run.id).count(),
        "model_calls": ModelCall.objects.filter(run_id=run.id).count(),
        "checkpoints": Checkpoint.objects.filter(run_id=run.id).count(),
        "approvals": Approval.objects.filter(run_id=run.id).count(),
    }


def age(runs, days: float) -> None:
    """The runs were created and last written `days` ago (their figures already folded into the metrics)."""
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE runs SET created_at = created_at - make_interval(days => %s),"
            " updated_at = updated_at - make_interval(days => %s) WHERE id = ANY(%s)",
            [days, days, [r.id for r in runs]],
        )
    while sweep_metrics().get("folded_runs"):
        pass


def completed(load_agent, submit, text="go"):
    load_agent(turns=TOOL_TURNS)
    run = submit(text=text)
    assert run_drive(run_id=run.id).kind.value == "completed"
    return Run.objects.get(id=run.id)


def waiting(load_agent, submit):
    load_agent(name="asker", turns=TOOL_TURNS, policy=ASK_FOR_ECHO)
    run = submit(agent="asker", text="may I echo?")
    assert run_drive(run_id=run.id).kind.value == "suspended"
    return Run.objects.get(id=run.id)


def running(load_agent, submit):
    """A run a worker holds right now, mid-way (its first step done, the lease taken again)."""
    load_agent(name="runner", turns=TOOL_TURNS)
    run = submit(agent="runner", text="keep running")
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE runs SET status = 'RUNNING', lease_owner = 'w-elsewhere', lease_epoch = lease_epoch + 1,"
            " lease_expires_at = now() + interval '1 hour' WHERE id = %s",
            [run.id],
        )
    return Run.objects.get(id=run.id)


def failed_transiently(run) -> Run:
    """`run` (ended) as if it had failed internal_error: a run a retry may give a new attempt."""
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE runs SET status = 'FAILED', final_message = NULL,"
            ' failure = \'{"reason": "internal_error", "message": "boom"}\'::jsonb WHERE id = %s',
            [run.id],
        )
    return Run.objects.get(id=run.id)


def test_the_sweep_removes_an_old_ended_runs_detail_and_keeps_its_row(load_agent, submit, settings):
    settings.AGENTRT_RETENTION_DAYS = 30
    old, recent = completed(load_agent, submit, "old"), completed(load_agent, submit, "recent")
    before = detail(old)
    assert before["events"] > 10 and before["tool_invocations"] == 3 and before["model_calls"] == 4
    age([old], 31)
    age([recent], 29)
    kept = {f: getattr(Run.objects.get(id=old.id), f) for f in ("status", "final_message", "usage", "step_count")}

    result = sweep_retention()

    assert result["detail_removed_runs"] == 1 and result["events"] == before["events"], result
    assert detail(old) == dict.fromkeys(before, 0)
    row = Run.objects.get(id=old.id)
    assert {f: getattr(row, f) for f in kept} == kept and row.final_message == "all echoed"
    assert row.usage.get("input_tokens", 0) >= 0 and row.usage == kept["usage"] and row.detail_removed_at is not None
    assert detail(recent)["events"] > 10 and Run.objects.get(id=recent.id).detail_removed_at is None
    # Done once: the run left the candidates' index.
    assert sweep_retention() == {"detail_removed_runs": 0}
    # A later run in the same session still reads the session's history (each run's input and answer).
    later, _ = run_submit(tenant=old.tenant, agent="bot", input="and again?", session=old.session_id)
    assert run_drive(run_id=later.id).kind.value == "completed"


def test_retention_is_off_by_default(load_agent, submit, settings):
    assert settings.AGENTRT_RETENTION_DAYS == 0
    old = completed(load_agent, submit)
    age([old], 3650)
    assert sweep_retention() == {"skipped": True}
    assert detail(old)["events"] > 10


def test_a_run_that_has_not_ended_keeps_everything_however_old(load_agent, submit, settings):
    settings.AGENTRT_RETENTION_DAYS = 1
    done, asking = completed(load_agent, submit), waiting(load_agent, submit)
    busy = running(load_agent, submit)
    assert asking.status == "WAITING_FOR_APPROVAL" and busy.status == "RUNNING"
    age([asking, busy, done], 400)
    keep = {r.id: detail(r) for r in (asking, busy)}
    assert keep[asking.id]["approvals"] == 1 and keep[asking.id]["checkpoints"] >= 1

    assert sweep_retention()["detail_removed_runs"] == 1  # the ended one
    call_command("purge_runs", "--tenant", "acme", "--before", (db_now() + timedelta(days=1)).date().isoformat())

    for run in (asking, busy):
        assert detail(run) == keep[run.id]
        row = Run.objects.get(id=run.id)
        assert row.detail_removed_at is None and row.status == run.status
    assert detail(done) == dict.fromkeys(keep[asking.id], 0)


def test_a_run_without_its_detail_is_neither_retried_nor_forked(load_agent, submit, settings):
    run = failed_transiently(completed(load_agent, submit))
    age([run], 10)
    call_command("purge_runs", "--tenant", "acme", "--before", db_now().isoformat())
    with pytest.raises(RunNotRetryable, match="removed by retention"):
        run_retry(run_id=run.id)
    with pytest.raises(RunNotForkable, match="removed by retention"):
        run_fork(run=Run.objects.get(id=run.id), from_step=1)
    assert Run.objects.get(id=run.id).status == "FAILED" and detail(run)["checkpoints"] == 0


def test_a_retry_and_the_removal_racing_on_separate_connections_leave_one_consistent_outcome(load_agent, submit):
    """Each takes the run's row lock: either the retry wins (the run is live
    again, its detail kept) or the removal does (and the retry is refused);
    never a live run without its checkpoints."""
    outcomes = set()
    for i in range(4):
        run = failed_transiently(completed(load_agent, submit, f"race {i}"))
        age([run], 10)
        retried, removed = race(
            lambda run=run: run_retry(run_id=run.id),
            lambda run=run: retention.remove_batch(run.tenant_id, db_now()),
        )
        row = Run.objects.get(id=run.id)
        if isinstance(retried, RunNotRetryable):
            assert removed.runs == 1 and row.status == "FAILED" and row.detail_removed_at is not None
            outcomes.add("removed")
        else:
            assert retried == "QUEUED", retried
            assert row.status == "QUEUED" and row.detail_removed_at is None and detail(row)["checkpoints"] >= 1
            assert removed.runs == 0
            outcomes.add("retried")
        Run.objects.filter(id=run.id).update(status="CANCELLED")  # out of the way of the next round's session
    assert outcomes


def test_purge_runs_dry_run_counts_what_the_purge_then_removes(load_agent, submit):
    runs = [completed(load_agent, submit, f"leaving {i}") for i in range(3)]
    age(runs, 5)
    other, _ = tenant_create(name="stays", username="bob", password="pw")
    before = (db_now() - timedelta(days=1)).isoformat()

    call_command("purge_runs", "--tenant", "acme", "--before", before, "--dry-run", stdout=(out := _Out()))
    counted = out.json()
    assert counted["runs"] == 3 and counted["events"] == sum(detail(r)["events"] for r in runs)
    assert all(detail(r)["events"] for r in runs)  # a dry run removes nothing

    call_command("purge_runs", "--tenant", "stays", "--before", before, stdout=(out := _Out()))
    assert out.json()["runs"] == 0 and all(detail(r)["events"] for r in runs)  # another tenant's runs: untouched

    call_command("purge_runs", "--tenant", str(runs[0].tenant_id), "--before", before, stdout=(out := _Out()))
    assert out.json() == {**counted, "dry_run": False}
    assert all(detail(r)["events"] == 0 for r in runs)
    assert other.id != runs[0].tenant_id


@pytest.mark.parametrize(
    "args, option",
    [
        (["--tenant", "nobody", "--before", "2026-01-01"], "--tenant"),
        (["--tenant", "acme", "--before", "last tuesday"], "--before"),
        (["--tenant", "acme", "--before", "2026-13-01"], "--before"),
        (["--tenant", "acme", "--before", "2026-01-01T00:00:00"], "--before"),  # no offset: which midnight?
    ],
)
def test_purge_runs_refuses_bad_input_naming_the_option_and_deletes_nothing(load_agent, submit, args, option):
    run = completed(load_agent, submit)
    age([run], 400)
    before = detail(run)
    with pytest.raises(CommandError, match=re.escape(option)):
        call_command("purge_runs", *args)
    proc = subprocess.run(
        [sys.executable, "manage.py", "purge_runs", *args],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and option in proc.stderr, proc.stderr
    assert detail(run) == before and Run.objects.get(id=run.id).detail_removed_at is None


def test_a_bad_retention_setting_is_refused_naming_it():
    proc = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=subprocess_env(AGENTRT_RETENTION_DAYS="thirty"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "AGENTRT_RETENTION_DAYS" in proc.stderr, proc.stderr


class _Out:
    def __init__(self):
        self.text = ""

    def write(self, s):
        self.text += s

    def flush(self):
        pass

    def json(self) -> dict:
        import json

        return json.loads(self.text.strip().splitlines()[-1])


# -- the plans, on tables big enough for the planner to choose ------------------

TABLES = ("runs", "events", "tool_invocations", "model_calls", "checkpoints", "approvals", "deliveries")


def clone_history(template: Run, tenants: list[Tenant], copies: int) -> None:
    """`copies` ended runs like `template`, with every detail row of it, spread
    over `tenants` and over the last 400 days, written in SQL."""
    with connection.cursor() as cur:
        cur.execute("SET statement_timeout = 0")  # the runtime's 5 s is for the product's statements, not a load

        def cols(table):
            cur.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = %s"
                " AND (is_identity = 'NO') ORDER BY ordinal_position",
                [table],
            )
            return [f'"{c}"' for (c,) in cur.fetchall()]

        cur.execute("CREATE TEMP TABLE clones (id uuid, k int, tenant uuid, at timestamptz)")
        cur.execute(
            "INSERT INTO clones SELECT gen_random_uuid(), k, (%s::uuid[])[1 + k %% %s],"
            " now() - make_interval(secs => k * 400 * 86400.0 / %s) FROM generate_series(1, %s) k",
            [[t.id for t in tenants], len(tenants), copies, copies],
        )
        over = {
            "id": "c.id",
            "tenant_id": "c.tenant",
            "created_at": "c.at",
            "updated_at": "c.at",
            "idempotency_key": "NULL",
            "status": "(ARRAY['COMPLETED','FAILED','CANCELLED'])[1 + c.k %% 3]",
        }
        names = cols("runs")
        cur.execute(
            f"INSERT INTO runs ({', '.join(names)}) SELECT {picked(names, over)}"
            " FROM runs t CROSS JOIN clones c WHERE t.id = %s",
            [template.id],
        )
        for table, extra in (
            ("events", {"sequence": "t.sequence + c.k * 1000"}),
            ("tool_invocations", {"id": "gen_random_uuid()", "idempotency_key": "gen_random_uuid()::text"}),
            ("model_calls", {"id": "gen_random_uuid()"}),
            ("checkpoints", {"id": "gen_random_uuid()"}),
            ("approvals", {"id": "gen_random_uuid()", "invocation_id": "NULL"}),
            ("deliveries", {"id": "gen_random_uuid()", "subscription_id": "NULL"}),
        ):
            names = cols(table)
            over = {"run_id": "c.id", "tenant_id": "c.tenant", **extra}
            cur.execute(
                f"INSERT INTO {table} ({', '.join(names)}) SELECT {picked(names, over)}"
                " FROM clones c CROSS JOIN " + table + " t WHERE t.run_id = %s",
                [template.id],
            )
        cur.execute("DELETE FROM metric_unfolded_runs WHERE run_id IN (SELECT id FROM clones)")
        for table in TABLES:
            cur.execute(f"ANALYZE {table}")
        cur.execute("RESET statement_timeout")


def picked(names: list[str], over: dict[str, str]) -> str:
    """The select list of a clone: each column of the template row, or its override."""
    return ", ".join(over.get(n.strip('"'), "t." + n) for n in names)


class Statements:
    def __init__(self):
        self.sent: list[tuple[str, tuple]] = []

    def __call__(self, execute, sql, params, many, context):
        if re.match(r"\s*(SELECT|DELETE|UPDATE)", sql) and re.search(r"\b(" + "|".join(TABLES) + r")\b", sql):
            self.sent.append((sql, params))
        return execute(sql, params, many, context)


def test_each_statement_of_a_batch_reads_through_an_index(load_agent, submit):
    """On 20,000 ended runs over four tenants and their detail rows (the
    template's, copied: ~500,000), analysed, with the planner free to choose:
    the candidates come from runs_detail_kept_idx, each DELETE by the run key
    of its table's index, the stamp by the primary key. No Seq Scan.
    RETENTION_PLANS=path writes the plans there (bench/RETENTION_PLANS.md)."""
    template = completed(load_agent, submit, "template")
    Approval.objects.create(
        tenant_id=template.tenant_id, run=template, kind="policy", request_hash="0" * 64, status="approved"
    )
    Delivery.objects.bulk_create(
        [
            Delivery(
                tenant_id=template.tenant_id,
                run=template,
                kind="webhook",
                event_type="run.completed",
                status="succeeded",
            )
        ]
    )
    tenants = [Tenant.objects.get(name="acme")] + [
        tenant_create(name=f"t{i}", username=f"u{i}", password="pw")[0] for i in range(3)
    ]
    clone_history(template, tenants, 20_000)
    cutoff = db_now() - timedelta(days=200)

    seen = Statements()
    with connection.execute_wrapper(seen):
        done = retention.remove_batch(tenants[1].id, cutoff)
    assert done.runs == retention.BATCH and done.rows["events"] > retention.BATCH

    plans = []
    with connection.cursor() as cur:
        for sql, params in seen.sent:
            cur.execute(f"EXPLAIN {sql}", params)
            plans.append((sql, "\n".join(row[0] for row in cur.fetchall())))
    assert len(plans) == 1 + 1 + len(retention.DETAIL) + 1  # candidates, lock, a DELETE a table, the stamp
    for sql, plan in plans:
        # (metric_unfolded_runs holds only the runs that ended in the last seconds: read whole, as the planner likes)
        assert not re.search(r"Seq Scan on (" + "|".join(TABLES) + r")\b", plan), f"{sql}\n{plan}"
    assert "runs_detail_kept_idx" in plans[0][1], plans[0][1]
    index_of = {
        "approvals": "approvals_run_id",
        "tool_invocations": "invocation_position_unique",
        "model_calls": "model_call_attempt_unique",
        "checkpoints": "checkpoint_run_version_unique",
        "events": "events_run_sequence_idx",
        "deliveries": "deliveries_run_idx",
    }
    for (name, _), (_, plan) in zip(retention.DETAIL, plans[2:-1], strict=True):
        assert index_of[name] in plan, f"{name}:\n{plan}"
    if out := os.environ.get("RETENTION_PLANS"):
        write_plans(Path(out), plans)


def write_plans(path: Path, plans) -> None:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT relname, reltuples::bigint FROM pg_class WHERE relname = ANY(%s) ORDER BY 1", [list(TABLES)]
        )
        sizes = ", ".join(f"{name} {n:,}" for name, n in cur.fetchall())
    lines = [
        "# Retention: the plans of one batch",
        "",
        "Captured by `tests/integration/test_retention.py::test_each_statement_of_a_batch_reads_through_an_index`",
        "(`RETENTION_PLANS=bench/RETENTION_PLANS.md`) on PostgreSQL, tables analysed, sequential scans allowed:",
        f"{sizes} rows.",
        "One batch of `maintenance.retention.remove_batch` (100 runs): the candidates, the lock, one DELETE a table,",
        "the stamp. The EXPLAINs are taken right after the batch ran, with its parameters.",
        "",
    ]
    for sql, plan in plans:  # the batch's hundred keys written as `...`
        sql = re.sub(r"(, %s){3,}", ", ...", re.sub(r"\s+", " ", sql).strip())
        plan = re.sub(r"(,[0-9a-f-]{36}){3,}", ",...", plan)
        lines += ["```sql", sql, "```", "```", plan, "```", ""]
    path.write_text("\n".join(lines))
