"""Commit 1 in flight while the read-only calls run (issue 16, item 3).

A read-only step's first commit (the model's answer and the decisions) is
sent, and its read-only calls run while PostgreSQL executes and flushes it;
commit 2 waits for its answer. Shown on the real schema with a second
connection that holds the run row's lock from step 2's model answer on:
commit 1 of step 2 cannot finish until the step's own read-only call lets
the lock go, so the call must run while the commit is in flight (on the
old, sequential path the commit waits on the lock until the connection's
5 s statement timeout and the run fails). What the call sees from outside
(no row of its step yet) shows the same thing."""

from __future__ import annotations

import json
import threading
import time
from unittest.mock import patch

import psycopg
import pytest
from django.db import connection

from checkpoints.repository import checkpoint_latest, materialise_rows
from runs.models import Event, ModelCall, Run, ToolInvocation
from runs.runtime import faults
from runs.runtime.executor import run_drive
from runs.tools import REGISTRY, register
from tests.conftest import subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)


def _dsn() -> str:
    return subprocess_env()["DATABASE_URL"]


class Holder:
    """A second connection that locks the run row once step 2's model has
    answered and lets go when the step's read-only `release` call runs.

    Not at `model.before_call`: that point comes before the store settles,
    so step 1's commit 2 may still be in flight there; locked first, the
    row would hold commit 2 (not step 2's commit 1) until the statement
    timeout, and the step would never reach its call."""

    def __init__(self, take_over: bool):
        self.take_over = take_over
        self.conn: psycopg.Connection | None = None
        self.run_id = None
        self.calls_seen: int | None = None
        self.model_calls = 0

    def fire(self, point: str, run_id) -> None:
        if point != "model.after_call":
            return
        self.model_calls += 1
        if self.model_calls == 2:  # step 2: every earlier unit answered (settled), step 2's commit 1 not yet sent
            self.run_id = run_id
            self.conn = psycopg.connect(_dsn())
            self.conn.execute("SELECT 1 FROM runs WHERE id = %s FOR UPDATE", [run_id])

    def release(self) -> dict:
        assert self.conn is not None, "the lock was never taken"
        self.calls_seen = self.conn.execute(
            "SELECT count(*) FROM tool_invocations WHERE run_id = %s AND step_number = 2", [self.run_id]
        ).fetchone()[0]
        if self.take_over:  # another worker took the run over meanwhile: commit 1 is fenced out
            self.conn.execute("UPDATE runs SET lease_epoch = lease_epoch + 1 WHERE id = %s", [self.run_id])
        self.conn.commit()
        self.conn.close()
        return {"released": True}


@pytest.fixture
def holder(request):
    h = Holder(take_over=getattr(request, "param", False))

    @register(name="release", read_only=True, parameters={"type": "object"})
    def release(args, ctx):
        return h.release()

    with patch.object(faults, "fire", h.fire):
        yield h
    REGISTRY.unregister("release")
    if h.conn is not None and not h.conn.closed:
        h.conn.close()


def turns():
    return [
        {"tool_calls": [{"name": "echo", "arguments": {"text": "one"}}]},
        {"tool_calls": [{"name": "release", "arguments": {}}]},
        {"text": "done"},
    ]


def test_a_read_only_call_runs_while_its_commit_1_is_in_flight(holder, load_agent, submit):
    load_agent(turns=turns(), tools=("echo", "release"))
    run = submit()

    outcome = run_drive(run_id=run.id)

    assert outcome is not None and outcome.kind.value == "completed", outcome
    assert holder.calls_seen == 0  # the call ran before its own step's decisions were committed
    rows = ToolInvocation.objects.filter(run_id=run.id, step_number=2)
    assert [(r.tool_name, r.status) for r in rows] == [("release", "completed")]
    assert connection.execute_wrappers == []  # the in-flight guard is gone


@pytest.mark.parametrize("holder", [True], indirect=True)
def test_a_fenced_commit_1_drops_the_results_of_its_read_only_calls(holder, load_agent, submit):
    load_agent(turns=turns(), tools=("echo", "release"))
    run = submit()

    outcome = run_drive(run_id=run.id)

    assert outcome is not None and outcome.kind.value == "fenced", outcome
    assert holder.calls_seen == 0  # it ran, while commit 1 waited on the lock
    assert not ToolInvocation.objects.filter(run_id=run.id, step_number=2).exists()
    assert ModelCall.objects.get(run_id=run.id, step_number=2).status == "started"  # commit 1 never landed
    step2 = [e.payload for e in Event.objects.filter(run_id=run.id, type__startswith="tool.call")]
    assert all(p.get("tool") != "release" for p in step2)
    # The connection that carried the unit in flight is usable again, unguarded.
    assert connection.execute_wrappers == []
    assert Run.objects.get(id=run.id).lease_epoch == 2


def test_a_read_only_tool_without_a_timeout_runs_after_commit_1(load_agent, submit):
    """A tool without a timeout runs on the worker's thread and may use its
    connection: its commit 1 is not overlapped."""
    seen = []

    @register(name="count_rows", read_only=True, timeout_seconds=0, parameters={"type": "object"})
    def count_rows(args, ctx):
        seen.append(ToolInvocation.objects.filter(run_id=ctx.run_id, step_number=ctx.step_number).count())
        return {"n": seen[-1]}

    try:
        load_agent(
            turns=[{"tool_calls": [{"name": "count_rows", "arguments": {}}]}, {"text": "done"}], tools=("count_rows",)
        )
        run = submit()
        outcome = run_drive(run_id=run.id)
    finally:
        REGISTRY.unregister("count_rows")

    assert outcome is not None and outcome.kind.value == "completed", outcome
    assert seen == [1]  # its own row, committed before it ran


def test_the_model_is_called_only_once_commit_2_has_its_answer(load_agent, submit):
    """Commit 2 (the results and the next call's `started` row) is sent and
    the next request built while it runs; the model call waits for its
    answer. A second connection holds the run row from just before step 1's
    commit 2 until step 2's model call happens — or, when the runtime does
    wait (as it must), until commit 2 has been seen waiting on the lock for
    a second; the model call then checks, from outside, that its `started`
    row is committed."""
    from runs.providers.scripted import ScriptedProvider

    state: dict = {"fired": 0}
    called = threading.Event()

    def release_later(conn: psycopg.Connection, run_id) -> None:
        with psycopg.connect(_dsn(), autocommit=True) as watch:
            for _ in range(3000):  # until commit 2 waits on the lock (30 s at most)
                waiting = watch.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                ).fetchone()[0]
                if waiting or called.is_set():
                    break
                time.sleep(0.01)
        called.wait(1.0)  # a runtime that does not wait calls the model meanwhile
        conn.commit()
        conn.close()

    def fire(point: str, run_id) -> None:
        if point == "checkpoint.before_write" and not state["fired"]:
            state["fired"] = 1
            conn = psycopg.connect(_dsn())
            conn.execute("SELECT 1 FROM runs WHERE id = %s FOR UPDATE", [run_id])
            state["thread"] = threading.Thread(target=release_later, args=(conn, run_id), daemon=True)
            state["thread"].start()

    original = ScriptedProvider.complete

    def complete(self, request, token):
        if state["fired"] and "seen" not in state:
            with psycopg.connect(_dsn(), autocommit=True) as look:
                state["seen"] = look.execute(
                    "SELECT count(*) FROM model_calls WHERE run_id = %s AND step_number = 2", [state["run"]]
                ).fetchone()[0]
            called.set()
        return original(self, request, token)

    load_agent(turns=turns()[:1] + [{"text": "done"}])
    run = submit()
    state["run"] = run.id
    with patch.object(faults, "fire", fire), patch.object(ScriptedProvider, "complete", complete):
        outcome = run_drive(run_id=run.id)
    state["thread"].join(timeout=30)

    assert outcome is not None and outcome.kind.value == "completed", outcome
    assert state["seen"] == 1  # step 2's `started` row was committed before its model call


# -- commit 2 sent behind commit 1 (libpq pipeline mode) ----------------------


@pytest.fixture
def order(monkeypatch):
    """What the connection carried, in order: ("send", n) when a unit is sent
    and ("answer", n) when its answer is read, n counting the units sent."""
    from runs.store import repository

    seen: list[tuple[str, int]] = []
    sent: list[object] = []  # kept alive: a unit is numbered by its place here
    send, wait = repository._InFlight.__init__, repository._InFlight.wait

    def number(unit) -> int:
        return next(n for n, known in enumerate(sent, start=1) if known is unit)

    def spy_send(self, *args, **kwargs):
        send(self, *args, **kwargs)
        sent.append(self)
        seen.append(("send", len(sent)))

    def spy_wait(self):
        pending = not self.answered
        try:
            return wait(self)
        finally:
            if pending:
                seen.append(("answer", number(self)))

    monkeypatch.setattr(repository._InFlight, "__init__", spy_send)
    monkeypatch.setattr(repository._InFlight, "wait", spy_wait)
    return seen


def test_commit_2_is_sent_before_commit_1_is_answered(order, load_agent, submit):
    """Each unit of a read-only step is its own transaction, and commit 2 is
    on the wire behind commit 1 before commit 1's answer is read: PostgreSQL
    starts it as soon as commit 1 has committed."""
    load_agent(turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "one"}}]}, {"text": "done"}])
    run = submit()

    outcome = run_drive(run_id=run.id)

    assert outcome is not None and outcome.kind.value == "completed", outcome
    assert order[:4] == [("send", 1), ("send", 2), ("answer", 1), ("answer", 2)]
    assert ToolInvocation.objects.get(run_id=run.id, step_number=1).status == "completed"
    assert connection.execute_wrappers == []


@pytest.fixture
def doomed_insert():
    """A trigger that fails any insert of a `doomed` tool call: commit 1 of
    the step that proposes one fails inside PostgreSQL (after its read-only
    call ran and commit 2 was sent behind it)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION doomed_insert() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN IF NEW.tool_name = 'doomed' THEN RAISE EXCEPTION 'doomed insert'; END IF; RETURN NEW; END $$"
        )
        cursor.execute(
            "CREATE TRIGGER doomed_insert BEFORE INSERT ON tool_invocations"
            " FOR EACH ROW EXECUTE FUNCTION doomed_insert()"
        )
    ran: list[int] = []

    @register(name="doomed", read_only=True, parameters={"type": "object"})
    def doomed(args, ctx):
        ran.append(ctx.step_number)
        return {"ok": True}

    yield ran
    REGISTRY.unregister("doomed")
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER doomed_insert ON tool_invocations")
        cursor.execute("DROP FUNCTION doomed_insert()")


def test_commit_2_writes_nothing_when_commit_1_fails(doomed_insert, order, load_agent, submit):
    """Commit 2 is sent before commit 1's answer; when commit 1 fails (here
    an error inside PostgreSQL, not a fence), commit 2's fence finds no tool
    call row of commit 1 and matches nothing: none of the step's results, no
    checkpoint of it and no `started` row of the next model call exist, and
    the connection is usable again."""
    load_agent(
        turns=[
            {"tool_calls": [{"name": "echo", "arguments": {"text": "one"}}]},
            {"tool_calls": [{"name": "doomed", "arguments": {}}]},
            {"text": "done"},
        ],
        tools=("echo", "doomed"),
    )
    run = submit()

    outcome = run_drive(run_id=run.id)

    assert outcome is not None and outcome.kind.value == "failed", outcome  # the error fails the run
    assert outcome.failure is not None and outcome.failure.error_class == "ProgrammingError"
    assert doomed_insert == [2]  # it ran, while commit 1 was in flight
    assert order.index(("send", 4)) < order.index(("answer", 3))  # commit 2 went out behind commit 1
    assert not ToolInvocation.objects.filter(run_id=run.id, step_number=2).exists()
    assert not ModelCall.objects.filter(run_id=run.id, step_number=3).exists()
    types = list(Event.objects.filter(run_id=run.id).order_by("sequence").values_list("type", flat=True))
    assert types.count("model.request.started") == 2, types  # steps 1 and 2, not 3
    assert "tool.call.completed" not in types[types.index("model.request.started", 4) :], types
    with connection.cursor() as cursor:
        cursor.execute("SELECT trigger FROM checkpoints WHERE run_id = %s ORDER BY version", [run.id])
        triggers = [t for (t,) in cursor.fetchall()]
    assert triggers == ["seed", "model_response", "tool_batch", "terminal"]  # step 1's three, then finalize's
    assert connection.execute_wrappers == []
    assert Run.objects.filter(id=run.id).count() == 1  # the connection answers again


def test_a_full_checkpoint_commit_2_goes_behind_commit_1_too(order, load_agent, submit):
    """Step 4's commit 2 carries a full checkpoint (version 9); it is sent
    before step 4's commit 1 is answered, and names that commit's turn event
    by ordinal, located by commit 1's own checkpoint (`prior_from`)."""
    load_agent(
        turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": f"s{i}"}}]} for i in range(1, 5)]
        + [{"text": "done"}]
    )
    run = submit()

    outcome = run_drive(run_id=run.id)

    assert outcome is not None and outcome.kind.value == "completed", outcome
    assert order.index(("send", 8)) < order.index(("answer", 7))  # step 4: commit 2 out before commit 1's answer
    with connection.cursor() as cursor:
        cursor.execute('SELECT "full", "trigger", state FROM checkpoints WHERE run_id = %s AND version = 9', [run.id])
        full, trigger, state = cursor.fetchone()
    assert (full, trigger) == (True, "tool_batch")
    state = state if isinstance(state, dict) else json.loads(state)
    turn = Event.objects.get(run_id=run.id, type="model.response.completed", payload__step=4)
    assert {"p": [1]} in state["conversation"] and state["prior_from"] + 1 == turn.sequence
    rebuilt = materialise_rows(run.id, [(9, True, state)])  # the full row alone reads back step 4's conversation
    assert rebuilt is not None and [m["role"] for m in rebuilt.conversation] == ["user"] + ["assistant", "tool"] * 4
    assert rebuilt.conversation[-2]["tool_calls"][0]["arguments"] == '{"text": "s4"}'
    final = checkpoint_latest(run.id)
    assert final is not None and len(final.conversation) == 1 + 2 * 4 + 1


def test_a_full_checkpoint_commit_2_writes_nothing_when_commit_1_fails(doomed_insert, order, load_agent, submit):
    """As above with step 4's commit 1 failing inside PostgreSQL after its
    full-checkpoint commit 2 went out behind it: commit 2 writes nothing (no
    version 8 or 9, no result of step 4, no `started` row of step 5)."""
    load_agent(
        turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": f"s{i}"}}]} for i in range(1, 4)]
        + [{"tool_calls": [{"name": "doomed", "arguments": {}}]}, {"text": "done"}],
        tools=("echo", "doomed"),
    )
    run = submit()

    outcome = run_drive(run_id=run.id)

    assert outcome is not None and outcome.kind.value == "failed", outcome
    assert doomed_insert == [4]
    assert order.index(("send", 8)) < order.index(("answer", 7)), order
    assert not ToolInvocation.objects.filter(run_id=run.id, step_number=4).exists()
    assert not ModelCall.objects.filter(run_id=run.id, step_number=5).exists()
    with connection.cursor() as cursor:
        cursor.execute("SELECT version, trigger FROM checkpoints WHERE run_id = %s ORDER BY version", [run.id])
        versions = cursor.fetchall()
    assert [v for v, _ in versions][:-1] == list(range(1, 8)) and versions[-1][1] == "terminal", versions
    assert connection.execute_wrappers == []
    assert Run.objects.filter(id=run.id).count() == 1
