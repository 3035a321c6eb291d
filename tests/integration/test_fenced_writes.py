"""The fence itself: a worker whose lease was taken over (on another
connection, by another owner at a newer epoch) commits nothing — each of the
store's write paths affects zero rows and raises `WorkerFenced`.

The end-to-end fencing tests reach the same code through a whole execution,
where a zombie's write can also fail for an unrelated reason (a duplicate
checkpoint key); these call the store directly, with writes that cannot
collide with anything, so only the fenced UPDATE's predicate can refuse them
(tests/mutants/fence_dropped_from_step_update.toml removes it)."""

from __future__ import annotations

from uuid import uuid4

import psycopg
import pytest
from django.db import connection

from runs.clock import CLOCK
from runs.domain.errors import WorkerFenced
from runs.domain.writes import InvocationInsert, ModelCallFinish, ModelCallInsert, UnitOfWork
from runs.models import Event, ModelCall, Run, ToolInvocation
from runs.runtime.queue import run_claim
from runs.store.repository import DjangoRunStore

pytestmark = pytest.mark.django_db(transaction=True)


def take_over_elsewhere(run_id):
    """What a takeover does, committed on a connection of its own."""
    s = connection.settings_dict
    with psycopg.connect(
        host=s["HOST"] or "127.0.0.1",
        port=s["PORT"] or 5432,
        user=s["USER"] or "postgres",
        dbname=s["NAME"],
        autocommit=True,
    ) as other:
        cur = other.execute(
            "UPDATE runs SET lease_owner = 'worker-b', lease_epoch = lease_epoch + 1,"
            " lease_expires_at = now() + interval '1 minute' WHERE id = %s RETURNING lease_epoch",
            [run_id],
        )
        return cur.fetchone()[0]


def store_for(claim):
    run = Run.objects.get(id=claim.run_id)
    return DjangoRunStore(
        run_id=run.id, tenant_id=run.tenant_id, session_id=run.session_id, owner=claim.owner, epoch=claim.epoch
    )


def snapshot(run_id):
    return (
        Run.objects.filter(id=run_id).values().get(),
        list(Event.objects.filter(run_id=run_id).order_by("sequence").values_list("sequence", "type")),
        ModelCall.objects.filter(run_id=run_id).count(),
        list(ToolInvocation.objects.filter(run_id=run_id).values_list("id", "status", "effect_sent_at", "lease_epoch")),
    )


def model_call_unit(*, step: int, finish: bool) -> UnitOfWork:
    """A fresh model-call row and an event: nothing here can collide with an
    existing row. With `finish` the same unit also finishes the call it
    inserts, which the one-statement path cannot batch (store_pg.can_batch),
    so the statement-by-statement path writes it."""
    now = CLOCK.now()
    work = UnitOfWork()
    call_id = uuid4()
    work.model_call_inserts.append(ModelCallInsert(id=call_id, step_number=step, attempt_number=1, started_at=now))
    if finish:
        work.model_call_finishes.append(
            ModelCallFinish(
                id=call_id,
                status="completed",
                usage={},
                stop_reason="stop",
                stream_had_output=False,
                error=None,
                prefix_sha256=None,
                finished_at=now,
            )
        )
    work.event("model.request.started", {"step": step, "attempt": 1}, now)
    return work


@pytest.mark.parametrize("path", ["one statement", "statement by statement"])
def test_a_stale_epoch_commit_writes_zero_rows_and_raises_worker_fenced(load_agent, submit, path):
    load_agent()
    run = submit()
    claim = run_claim(run_id=run.id, owner="worker-a")
    store = store_for(claim)
    store.commit(model_call_unit(step=98, finish=path != "one statement"))  # the owner's own write goes through
    assert ModelCall.objects.filter(run_id=run.id).count() == 1
    new_epoch = take_over_elsewhere(run.id)
    assert new_epoch == claim.epoch + 1
    before = snapshot(run.id)
    with pytest.raises(WorkerFenced):
        store.commit(model_call_unit(step=99, finish=path != "one statement"))  # a new step: no key can collide
    assert snapshot(run.id) == before
    row = Run.objects.get(id=run.id)
    assert (row.lease_owner, row.lease_epoch) == ("worker-b", new_epoch)


def test_a_stale_epoch_watermark_writes_zero_rows_and_raises_worker_fenced(load_agent, submit):
    load_agent()
    run = submit()
    claim = run_claim(run_id=run.id, owner="worker-a")
    store = store_for(claim)
    now = CLOCK.now()
    work = UnitOfWork()
    inv = uuid4()
    work.invocation_inserts.append(
        InvocationInsert(
            id=inv,
            step_number=1,
            call_index=0,
            call_id="call_1_0",
            tool_name="http_post",
            arguments={"url": "http://x.invalid/"},
            raw_arguments="{}",
            idempotency_key=f"{run.id}:1:0",
            status="authorized",
            read_only=False,
            side_effect="external",
            created_at=now,
        )
    )
    work.event("tool.call.proposed", {"invocation": str(inv)}, now)
    store.commit(work)
    take_over_elsewhere(run.id)
    before = snapshot(run.id)
    with pytest.raises(WorkerFenced):
        store.mark_effect_sent(inv, 1, {"invocation": str(inv)}, CLOCK.now())
    assert snapshot(run.id) == before
    assert ToolInvocation.objects.get(id=inv).effect_sent_at is None


# -- the terminal transition ----------------------------------------------------------


def fenced_events(run_id):
    return list(Event.objects.filter(run_id=run_id, type="run.fenced").values_list("payload", flat=True))


@pytest.mark.parametrize("path", ["one statement", "statement by statement"])
def test_a_stale_epoch_finalize_neither_completes_the_run_nor_releases_the_new_holders_lease(load_agent, submit, path):
    """finalize's own fenced UPDATE (`transition_fence`, the only statement
    that ends a leased run and releases its lease) checks owner and epoch: a
    worker whose lease was taken over, committed on another connection, that
    goes on to finalize COMPLETED changes nothing but `run.fenced` — the run
    stays RUNNING under the new holder, whose lease is neither cleared nor
    moved (tests/mutants/transition_fence_unguarded.toml)."""
    from runs.domain.values import OutcomeKind, RunOutcome
    from runs.runtime.finalize import finalize_detached

    load_agent()
    run = submit()
    claim = run_claim(run_id=run.id, owner="worker-a")
    new_epoch = take_over_elsewhere(run.id)
    held = Run.objects.filter(id=run.id).values().get()
    assert (held["status"], held["lease_owner"], held["lease_epoch"]) == ("RUNNING", "worker-b", new_epoch)
    before = snapshot(run.id)
    # A unit no key can collide with: only the fence can refuse it (with `finish`, the statement-by-statement path).
    work = model_call_unit(step=99, finish=path != "one statement")
    outcome = finalize_detached(claim, RunOutcome(kind=OutcomeKind.COMPLETED, final_message="stolen"), work)
    assert outcome.kind is OutcomeKind.FENCED
    row, events, model_calls, invocations = snapshot(run.id)
    assert row == before[0]  # still RUNNING, worker-b's owner, epoch and expiry; no final message
    assert (row["status"], row["lease_owner"], row["lease_expires_at"]) == (
        "RUNNING",
        "worker-b",
        held["lease_expires_at"],
    )
    assert (model_calls, invocations) == before[2:]
    assert [t for _, t in events] == [t for _, t in before[1]] + ["run.fenced"]
    assert fenced_events(run.id) == [{"lease_owner": "worker-a", "lease_epoch": claim.epoch}]


# -- the heartbeat --------------------------------------------------------------------


class _Token:
    def __init__(self):
        self.reasons = []

    def cancel(self, reason):
        self.reasons.append(reason)


def test_a_resumed_zombies_heartbeat_neither_extends_the_new_lease_nor_passes_its_pre_send_check(load_agent, submit):
    """A worker frozen past its lease (SIGSTOP) whose run was taken over,
    committed on another connection, resumes: its heartbeat thread (the real
    `Supervisor`, renewing on a connection of its own through the real
    `lease.renew`) beats once and finds the lease gone. The renew's owner and
    epoch guard must match no row: the new holder's expiry is not moved, the
    zombie's token is cancelled as fenced, and its pre-send check
    (`may_start_effect`, what the pipeline asks right before a watermark and
    a send) refuses. The zombie's clock is a fake only to say how long it was
    frozen (tests/mutants/renew_unguarded.toml)."""
    from runs.domain.values import CancelReason
    from runs.runtime.supervisor import Supervisor
    from tests.conftest import wait_for
    from tests.unit.fakes import FakeClock

    load_agent()
    run = submit()
    claim = run_claim(run_id=run.id, owner="worker-a")
    clock, token = FakeClock(), _Token()
    lease = 0.3  # the zombie's beat interval: lease / 3 of real time
    zombie = Supervisor(
        run_id=run.id, owner="worker-a", epoch=claim.epoch, token=token, clock=clock, lease_seconds=lease
    )
    new_epoch = take_over_elsewhere(run.id)
    held = Run.objects.filter(id=run.id).values("lease_owner", "lease_epoch", "lease_expires_at").get()
    clock.advance(10 * lease)  # it was frozen well past its lease: its last good beat is that old
    zombie.start()  # SIGCONT: its heartbeat thread goes on
    try:
        wait_for(lambda: token.reasons or zombie.beats, timeout=10, message="the zombie's first heartbeat")
        assert (zombie.beats, token.reasons) == (0, [CancelReason.FENCED])
        assert not zombie.may_start_effect()
        wait_for(lambda: not zombie._thread.is_alive(), timeout=10, message="the zombie to stop renewing")
        assert not zombie.may_start_effect()
    finally:
        zombie.stop()
    assert Run.objects.filter(id=run.id).values("lease_owner", "lease_epoch", "lease_expires_at").get() == held
    assert held["lease_owner"] == "worker-b" and held["lease_epoch"] == new_epoch
