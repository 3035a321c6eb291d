"""A step's writes do not read more as the run grows (issue 16 item 2): the
UPDATE of the step's model call and of its tool call finds the one row by
primary key. Before, each walked the run's (run_id, ...) unique index and read
every row the run had written so far, so a 400-step run read 200 index
entries per update on average. Counted by the server (pg_stat_user_indexes)
over runs of two lengths, driven in-process on the real write path."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

from runs.runtime.executor import run_drive
from runs.store.cursor import keyed_plans
from tests.conftest import subprocess_env
from tests.pgstats import counts

pytestmark = pytest.mark.django_db(transaction=True)

RUN_INDEXES = ("model_call_attempt_unique", "invocation_position_unique")
KEYS = ("model_calls_pkey", "tool_invocations_pkey")


def echo_steps(n: int) -> list[dict]:
    return [{"tool_calls": [{"name": "echo", "arguments": {"text": f"step {i}"}}]} for i in range(n - 1)] + [
        {"text": "done"}
    ]


def index_entries_read() -> dict[str, int]:
    """Index entries read so far, this backend's included."""
    return dict(
        counts(
            "SELECT indexrelname, idx_tup_read FROM pg_stat_user_indexes WHERE indexrelname = ANY(%s)",
            [list(RUN_INDEXES + KEYS)],
        )
    )


def reads_of_one_run(load_agent, submit, steps: int) -> dict[str, int]:
    limits = {"max_steps": steps + 5, "max_model_calls": steps + 10, "max_tool_calls": steps + 10}
    load_agent(name=f"flat{steps}", turns=echo_steps(steps), limits=limits)
    run = submit(agent=f"flat{steps}", text=f"{steps} steps")
    before = index_entries_read()
    assert run_drive(run_id=run.id).kind.value == "completed"
    after = index_entries_read()
    return {name: after.get(name, 0) - before.get(name, 0) for name in RUN_INDEXES + KEYS}


def test_a_steps_updates_read_one_index_entry_each_whatever_the_runs_length(load_agent, submit):
    short = reads_of_one_run(load_agent, submit, 5)
    long = reads_of_one_run(load_agent, submit, 65)
    # 60 more steps: one model call and one tool call updated in each, and at
    # most one more probe by primary key per step: the fence of a unit sent
    # behind the one in flight checks a tool call that unit inserted
    # (STEP_FENCE_AFTER).
    by_run = sum(long[name] - short[name] for name in RUN_INDEXES)
    model_calls = long["model_calls_pkey"] - short["model_calls_pkey"]
    tool_calls = long["tool_invocations_pkey"] - short["tool_invocations_pkey"]
    assert by_run == 0, (short, long)  # the run's indexes are not walked (it was ~3,800 entries)
    assert 60 <= model_calls <= 65, (short, long)  # one entry per UPDATE
    assert 60 <= tool_calls <= 125, (short, long)  # one per UPDATE, at most one per fence guard


def sequential_scans() -> dict[str, int]:
    return dict(
        counts(
            "SELECT relname, seq_scan FROM pg_stat_user_tables"
            " WHERE relname IN ('runs', 'sessions', 'model_calls', 'tool_invocations', 'checkpoints', 'events')"
        )
    )


def test_a_slice_finds_its_rows_by_key_even_when_the_statistics_say_the_tables_are_empty(load_agent, submit):
    """A new database analyzed while nearly empty: the step's statements,
    prepared once per connection, would keep a sequential scan as their plan
    and read every row of the growing tables at each step (session 16: 2.5 M
    tool-call rows read for 1,600 steps). A slice runs with the sequential
    scan off (runs.store.repository.keyed_plans), and gives the setting back."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # the tables as good as empty, and the statistics saying so
    load_agent(name="keyed", turns=echo_steps(30), limits={"max_steps": 35, "max_model_calls": 40})
    before = sequential_scans()
    for i in range(3):
        run = submit(agent="keyed", text=f"run {i}")
        assert run_drive(run_id=run.id).kind.value == "completed"
    after = sequential_scans()
    scans = {name: after[name] - before.get(name, 0) for name in after}
    # The submit and the claim, outside the slice, may scan a table believed empty: a few per run, not per step
    # (before: 189 of `runs` and of `sessions`, 174 of `tool_invocations` for these 90 steps).
    assert all(n <= 3 * 3 for n in scans.values()), scans
    assert scans["tool_invocations"] == scans["model_calls"] == scans["checkpoints"] == 0, scans
    with connection.cursor() as cursor:
        cursor.execute("SHOW enable_seqscan")
        assert cursor.fetchone()[0] == "on"


def test_a_slice_whose_connection_broke_does_not_fail_on_giving_the_setting_back():
    """The server ends the connection during the slice (a restart, a
    terminated backend): the slice's own statements have met that already;
    giving the setting back does not raise a second time, and the next
    statement runs on a new connection with the default setting."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    with keyed_plans():
        with connection.cursor() as cursor:
            cursor.execute("SHOW enable_seqscan")
            assert cursor.fetchone()[0] == "off"
        with psycopg.connect(subprocess_env()["DATABASE_URL"], autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", [pid])
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid(), current_setting('enable_seqscan')")
        new_pid, setting = cursor.fetchone()
    assert new_pid != pid and setting == "on"
