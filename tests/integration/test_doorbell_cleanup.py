"""The reclaim sweep keeps django-q2's queue to the doorbells that matter.

A `drive_run` doorbell taken by a pusher (or a worker) that then died stays in the ORM queue, locked until
django-q2's `retry`, minutes later; the long soak's crash loop of pushers piled up some 3,900 of them, most
for runs that had long ended, ahead of the doorbells of the runs still waiting. When the sweep rings again
for a queued run it deletes that run's lost doorbells, and it deletes every doorbell of a run that has ended;
a doorbell taken moments ago, or still waiting, is left alone. Real PostgreSQL, django-q2's own ORM broker."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django_q.models import OrmQ

from maintenance.sweeps.reclaim import read_doorbells, sweep_reclaim
from runs.models import Run
from runs.runtime.queue import db_now

pytestmark = pytest.mark.django_db(transaction=True)

GRACE = 5.0


def doorbells() -> dict[str, list[OrmQ]]:
    out: dict[str, list[OrmQ]] = {}
    for row in OrmQ.objects.order_by("id"):
        if row.task.get("func") == "runs.tasks.drive_run":
            out.setdefault(str(row.task["args"][0]), []).append(row)
    return out


def taken(row: OrmQ, seconds_ago: float) -> None:
    """As django-q2's broker marks a row it hands out: locked until `retry` after it was taken."""
    retry = timedelta(seconds=settings.Q_CLUSTER["retry"])
    OrmQ.objects.filter(id=row.id).update(lock=db_now() - timedelta(seconds=seconds_ago) + retry)


def age(run: Run, seconds: float) -> None:
    Run.objects.filter(id=run.id).update(updated_at=db_now() - timedelta(seconds=seconds))


def test_a_queued_runs_lost_doorbell_is_replaced_not_added_to(load_agent, submit):
    load_agent()
    run = submit()
    (row,) = doorbells()[str(run.id)]
    taken(row, seconds_ago=GRACE + 60)  # its pusher died with it a minute ago
    age(run, GRACE + 60)

    result = sweep_reclaim(queued_grace_seconds=GRACE)

    rows = doorbells()[str(run.id)]
    assert result["requeued_doorbells"] == 1 and result["dropped_doorbells"] == 1
    assert [r.id for r in rows] != [row.id] and len(rows) == 1 and rows[0].lock <= db_now()  # one fresh, waiting
    assert read_doorbells(db_now(), GRACE) == ({str(run.id)}, {})


def test_an_ended_runs_doorbells_go_and_a_live_one_is_left_alone(load_agent, submit):
    load_agent()
    ended, waiting, fresh = submit(text="a"), submit(text="b"), submit(text="c")
    for run in (ended, waiting, fresh):
        age(run, GRACE + 60)
    bells = doorbells()
    taken(bells[str(ended.id)][0], seconds_ago=GRACE + 60)  # lost, and its run has ended meanwhile
    Run.objects.filter(id=ended.id).update(status="COMPLETED")
    OrmQ.objects.create(key=bells[str(ended.id)][0].key, payload=bells[str(ended.id)][0].payload)  # another one waiting
    taken(bells[str(fresh.id)][0], seconds_ago=1)  # taken a second ago: its worker is on it

    result = sweep_reclaim(queued_grace_seconds=GRACE)

    after = doorbells()
    assert str(ended.id) not in after  # both of the ended run's rows went
    assert [r.id for r in after[str(waiting.id)]] == [bells[str(waiting.id)][0].id]  # still waiting: kept, no second
    assert [r.id for r in after[str(fresh.id)]] == [bells[str(fresh.id)][0].id]  # taken moments ago: kept
    assert result["requeued_doorbells"] == 0 and result["dropped_doorbells"] == 2
