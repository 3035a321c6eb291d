"""Fair workers (issue 34 item 5), in-process on PostgreSQL: a tenant holds at
most AGENTRT_TENANT_MAX_RUNNING leases. A claim over its tenant's share leaves
the run QUEUED (its doorbell spent); another tenant's run is claimed
meanwhile; when a run of the tenant releases its lease — it completes, waits
or yields — finalize rings the doorbell of the tenant's next queued run.
Concurrent claims of one tenant at its share cannot both win: each takes the
tenant's advisory lock and counts once it holds it (runs/store/lease.py).
The same through a real qcluster: tests/e2e/test_fair_workers.py."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections
from django_q.models import OrmQ

from approvals.models import Approval
from maintenance.sweeps.reclaim import sweep_reclaim
from runs.clock import CLOCK
from runs.domain.cancellation import Token
from runs.domain.values import OutcomeKind, RunOutcome
from runs.models import Event, Run
from runs.runtime.executor import execute_run
from runs.runtime.finalize import finalize
from runs.runtime.queue import run_claim, run_claim_next
from runs.runtime.wiring import build_context
from runs.services import agent_load, run_submit, tenant_create
from runs.store import lease
from tests.conftest import race, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

APPROVE_POSTS = {"default": "allow", "rules": [{"tool": "http_post", "decision": "require_approval"}]}


class Alive:
    """The lease monitor of a worker whose heartbeats all succeed."""

    def may_start_effect(self) -> bool:
        return True


def status(run) -> str:
    return Run.objects.filter(id=run.id).values_list("status", flat=True).get()


def doorbells() -> list[str]:
    """The runs with a drive_run task in django-q2's queue, in queue order."""
    return [
        str(row.task["args"][0]) for row in OrmQ.objects.order_by("id") if row.task.get("func").endswith("drive_run")
    ]


def spend_doorbells() -> None:
    """What the workers' deliveries did to the queue: every doorbell rung so far is gone."""
    OrmQ.objects.all().delete()


def running_of(tenant_id) -> int:
    return Run.objects.filter(tenant_id=tenant_id, status="RUNNING").count()


@pytest.fixture
def share(settings):
    settings.AGENTRT_TENANT_MAX_RUNNING = 1
    return settings


@pytest.fixture
def globex():
    """A second tenant with an agent of its own."""
    other, _ = tenant_create(name="globex", username="bob", password="pw")
    agent_load(
        tenant=other,
        definition={
            "name": "bot",
            "instructions": "test agent",
            "model": {"provider": "scripted", "turns": [{"text": "done"}]},
            "tools": ["echo"],
        },
    )

    def submit(text="hello"):
        run, _ = run_submit(tenant=other, agent="bot", input=text)
        return run

    return submit


def test_a_run_over_its_tenants_share_stays_queued_while_another_tenants_run_is_claimed(
    share, load_agent, submit, globex
):
    load_agent()
    first, second = submit(text="first"), submit(text="second")
    theirs = globex("theirs")
    held = run_claim(run_id=first.id, owner="worker-1")
    assert held is not None
    assert run_claim(run_id=second.id, owner="worker-2") is None  # the tenant holds its one lease
    row = Run.objects.get(id=second.id)
    assert (row.status, row.lease_epoch, row.lease_owner) == ("QUEUED", 0, None)
    assert not Event.objects.filter(run_id=second.id, type="run.claimed").exists()
    assert run_claim(run_id=theirs.id, owner="worker-2") is not None  # another tenant's is not held back
    assert running_of(first.tenant_id) == 1


@pytest.mark.parametrize("release", ["completes", "waits", "yields"])
def test_a_release_rings_the_doorbell_of_the_run_its_tenants_share_left_queued(
    release, share, load_agent, submit, sink
):
    if release == "waits":
        post = {"name": "http_post", "arguments": {"url": sink.url, "json": {}}}
        load_agent(turns=[{"tool_calls": [post]}, {"text": "done"}], tools=("http_post",), policy=APPROVE_POSTS)
    else:
        load_agent()
    first, second = submit(text="first"), submit(text="second")
    held = run_claim(run_id=first.id, owner="worker-1")
    assert run_claim(run_id=second.id, owner="worker-2") is None
    spend_doorbells()  # both doorbells were delivered: the first claimed, the second left queued

    if release == "yields":
        ctx = build_context(held, token=Token(), lease=Alive())
        assert finalize(ctx, held, RunOutcome(kind=OutcomeKind.YIELDED)).kind is OutcomeKind.YIELDED
        assert status(first) == "QUEUED"
        assert doorbells() == [str(first.id), str(second.id)]  # its own, then the one it owes
    else:
        outcome = execute_run(held)
        assert outcome.kind is (OutcomeKind.COMPLETED if release == "completes" else OutcomeKind.SUSPENDED)
        if release == "waits":
            assert Approval.objects.filter(run_id=first.id, status="pending").exists()
        assert doorbells() == [str(second.id)]
    assert run_claim(run_id=second.id, owner="worker-2") is not None  # the doorbell it rang finds room


def test_a_release_rings_nothing_when_its_tenant_has_no_run_waiting_or_no_room(share, load_agent, submit, settings):
    load_agent()
    alone = submit(text="alone")
    held = run_claim(run_id=alone.id, owner="worker-1")
    spend_doorbells()
    execute_run(held)
    assert doorbells() == []  # nothing of the tenant is queued

    settings.AGENTRT_TENANT_MAX_RUNNING = 2
    first, second, third = submit(text="first"), submit(text="second"), submit(text="third")
    claims = [run_claim(run_id=run.id, owner=f"worker-{i}") for i, run in enumerate((first, second))]
    assert all(claims)
    assert run_claim(run_id=third.id, owner="worker-3") is None
    spend_doorbells()
    # A fenced slice released nothing: another owner holds the lease now, and the tenant is still full.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE runs SET lease_owner = 'other', lease_epoch = lease_epoch + 1 WHERE id = %s", [first.id])
    assert execute_run(claims[0]).kind is OutcomeKind.FENCED
    assert doorbells() == []
    execute_run(claims[1])  # this one releases: room for one
    assert doorbells() == [str(third.id)]


def test_claim_next_passes_over_a_tenant_at_its_share(share, load_agent, submit, globex):
    load_agent()
    first, second = submit(text="first"), submit(text="second")
    theirs = globex("theirs")  # queued after `second`: the next run in queue order is `second`
    held = run_claim(run_id=first.id, owner="worker-1")
    taken = run_claim_next(owner="worker-2")
    assert taken is not None and taken.run_id == theirs.id
    assert run_claim_next(owner="worker-3") is None  # the only queued run is over its tenant's share
    execute_run(held)
    taken = run_claim_next(owner="worker-3")
    assert taken is not None and taken.run_id == second.id


ROUNDS = 15


@pytest.mark.parametrize("how", ["by id", "next"])
def test_concurrent_claims_of_one_tenant_at_its_share_have_one_winner(how, settings, load_agent, submit):
    """Two claims on connections of their own, released together by a
    barrier, for two queued runs of a tenant with one slot left."""
    settings.AGENTRT_TENANT_MAX_RUNNING = 2
    load_agent()
    for round_ in range(ROUNDS):
        Run.objects.filter(status="RUNNING").update(status="COMPLETED", lease_owner=None, lease_expires_at=None)
        already = submit(text=f"round {round_}: running")
        assert run_claim(run_id=already.id, owner="worker-0") is not None
        one, two = submit(text=f"round {round_}: one"), submit(text=f"round {round_}: two")
        if how == "by id":
            won = race(
                lambda one=one: run_claim(run_id=one.id, owner="worker-1"),
                lambda two=two: run_claim(run_id=two.id, owner="worker-2"),
            )
        else:
            won = race(lambda: run_claim_next(owner="worker-1"), lambda: run_claim_next(owner="worker-2"))
        assert not [r for r in won if isinstance(r, Exception)], won
        assert sum(r is not None for r in won) == 1, (round_, won)
        assert running_of(already.tenant_id) == 2, round_


def tenant_lock_waiters() -> int:
    """Backends waiting for a tenant's advisory lock (the two-key form: objsubid 2)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid = %s"
            " AND objsubid = 2",
            [lease.SHARE_LOCK],
        )
        return cursor.fetchone()[0]


def test_every_claim_of_a_tenant_takes_the_same_lock():
    """The claim by id's guard (agentrt_tenant_leases, ops/migrations/0007) and
    claim-next (runs.store.lease) lock a tenant under one key."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_functiondef('agentrt_tenant_leases(uuid)'::regprocedure)")
        body = cursor.fetchone()[0]
    assert f"pg_advisory_xact_lock({lease.SHARE_LOCK}, hashtext(p_tenant::text))" in body, body
    assert f"pg_advisory_xact_lock({lease.SHARE_LOCK}, hashtext(tenant_id::text))" in lease._next_tenant_sql()


def test_a_claim_waits_for_a_concurrent_claim_of_its_tenant_then_counts_it(share, load_agent, submit, monkeypatch):
    """The race made certain: the first claim is held open after its UPDATE,
    before its commit; the second, for another run of the tenant, must wait
    for it (the tenant's lock) and then find the tenant at its share. Without
    the lock the second would count no lease (the first is not committed) and
    win too."""
    load_agent()
    first, second = submit(text="first"), submit(text="second")
    inside, go = threading.Event(), threading.Event()
    append = lease.append_events

    def held_open(cursor, **kw):
        if threading.current_thread().name == "first-claim":
            inside.set()
            go.wait(30)
        return append(cursor, **kw)

    monkeypatch.setattr(lease, "append_events", held_open)
    results: dict[str, object] = {}

    def claim(name, run):
        try:
            results[name] = run_claim(run_id=run.id, owner=name)
        except Exception as exc:
            results[name] = exc
        finally:
            connections.close_all()

    one = threading.Thread(target=claim, args=("first-claim", first), name="first-claim")
    two = threading.Thread(target=claim, args=("second-claim", second), name="second-claim")
    one.start()
    assert inside.wait(30), "the first claim never reached its event"
    two.start()
    try:
        wait_for(lambda: tenant_lock_waiters() or "second-claim" in results, timeout=30, message="the second claim")
        waited = "second-claim" not in results
    finally:
        go.set()
        one.join(30)
        two.join(30)
    assert results["first-claim"] is not None and not isinstance(results["first-claim"], Exception), results
    assert waited, f"the second claim did not wait for the first: {results}"
    assert results["second-claim"] is None, results
    assert status(second) == "QUEUED" and running_of(first.tenant_id) == 1


def test_the_reclaim_sweep_rings_again_only_for_tenants_under_their_share(share, load_agent, submit, globex):
    """A QUEUED run with no doorbell is rung again by the sweep — unless its
    tenant holds its share: a claim spent its doorbell on purpose, and the
    tenant's next release rings for it."""
    load_agent()
    first, second = submit(text="first"), submit(text="second")
    theirs = globex("theirs")
    run_claim(run_id=first.id, owner="worker-1")
    assert run_claim(run_id=second.id, owner="worker-2") is None
    spend_doorbells()  # theirs' lost too
    Run.objects.filter(status="QUEUED").update(updated_at=CLOCK.now() - timedelta(minutes=1))
    result = sweep_reclaim(queued_grace_seconds=5)
    assert result["requeued_doorbells"] == 1
    assert doorbells() == [str(theirs.id)]
