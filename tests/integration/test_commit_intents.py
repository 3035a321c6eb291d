"""What joins a commit is data: every intent a `UnitOfWork` may carry (runs.domain.writes) has its one
handler once the apps are ready (runs/runtime/wiring.py `connect_intents`), the store runs a unit's intents
in its transaction, and an intent nobody handles rolls the whole unit back instead of being dropped."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django_q.models import OrmQ

from runs.clock import CLOCK
from runs.domain import writes
from runs.domain.writes import Intent, RingDoorbell, UnitOfWork
from runs.models import Event, Run
from runs.runtime.queue import run_claim
from runs.store import intents
from runs.store.repository import DjangoRunStore

pytestmark = pytest.mark.django_db(transaction=True)


@dataclass(frozen=True, slots=True)
class Unhandled(Intent):
    """An intent no handler was registered for."""


def store_for(claim) -> DjangoRunStore:
    run = Run.objects.get(id=claim.run_id)
    return DjangoRunStore(
        run_id=run.id, tenant_id=run.tenant_id, session_id=run.session_id, owner=claim.owner, epoch=claim.epoch
    )


def doorbells(run_id) -> int:
    """The drive_run tasks for `run_id` in django-q2's queue."""
    return sum(
        1
        for row in OrmQ.objects.all()
        if row.task.get("func", "").endswith("drive_run") and str(row.task["args"][0]) == str(run_id)
    )


def test_every_intent_type_of_the_domain_has_its_one_handler_once_the_apps_are_ready():
    declared = {
        value
        for value in vars(writes).values()
        if isinstance(value, type) and issubclass(value, Intent) and value is not Intent
    }

    assert declared == {
        writes.RingDoorbell,
        writes.StartChildren,
        writes.JoinParent,
        writes.EnqueueDeliveries,
        writes.Wake,
    }
    assert intents.registered() == declared


@pytest.mark.parametrize("path", ["one statement", "statement by statement"])
def test_a_units_intent_runs_in_its_transaction(load_agent, submit, monkeypatch, path):
    load_agent()
    run = submit()
    claim = run_claim(run_id=run.id, owner="worker-a")
    if path == "statement by statement":
        monkeypatch.setattr("runs.store.repository.can_batch", lambda work: False)
    before = doorbells(run.id)
    work = UnitOfWork()
    work.event("run.resumed", {"lease_epoch": claim.epoch}, CLOCK.now())
    work.intents.append(RingDoorbell(run.id))

    store_for(claim).commit(work)

    assert doorbells(run.id) == before + 1
    assert Event.objects.filter(run_id=run.id, type="run.resumed").count() == 1


@pytest.mark.parametrize("path", ["one statement", "statement by statement"])
def test_an_intent_with_no_handler_rolls_its_whole_unit_back(load_agent, submit, monkeypatch, path):
    load_agent()
    run = submit()
    claim = run_claim(run_id=run.id, owner="worker-a")
    if path == "statement by statement":
        monkeypatch.setattr("runs.store.repository.can_batch", lambda work: False)
    before = (doorbells(run.id), Event.objects.filter(run_id=run.id).count())
    work = UnitOfWork()
    work.event("run.resumed", {"lease_epoch": claim.epoch}, CLOCK.now())
    work.intents += [RingDoorbell(run.id), Unhandled()]

    with pytest.raises(LookupError, match="Unhandled"):
        store_for(claim).commit(work)

    assert (doorbells(run.id), Event.objects.filter(run_id=run.id).count()) == before
