"""Submits racing on separate connections behind a barrier. The loser's
unique violation (the Idempotency-Key, the session's one active run) is
raised by the submit's pipelined inserts when their answers are read
(runs/store/cursor.py `pipelined`): it must still arrive as Django's
IntegrityError, leave nothing of the losing transaction behind, and be
answered as before — the winner's run for the same key and body, 409 for a
busy session."""

from __future__ import annotations

import pytest

from checkpoints.models import Checkpoint
from runs.errors import ActiveRunExists
from runs.models import Event, Run, Session
from runs.runtime.executor import run_drive
from runs.services import run_submit
from tests.conftest import race

pytestmark = pytest.mark.django_db(transaction=True)


def test_racing_submits_with_one_idempotency_key_make_one_run_and_both_get_it(tenant, load_agent):
    load_agent()
    results = race(*[lambda: run_submit(tenant=tenant, agent="bot", input="pay once", idempotency_key="k-1")] * 4)
    assert all(isinstance(r, tuple) for r in results), results
    assert len({run.id for run, _ in results}) == 1
    assert sorted(created for _, created in results) == [False, False, False, True]
    assert Run.objects.filter(tenant=tenant).count() == 1
    assert Session.objects.filter(tenant=tenant).count() == 1  # the losers' sessions rolled back with them
    assert Checkpoint.objects.count() == 1
    assert Event.objects.filter(type="run.created").count() == 1


def test_racing_submits_to_one_session_start_one_run_and_the_others_are_refused(tenant, load_agent, submit):
    load_agent(turns=[{"text": "first"}, {"text": "second"}])
    first = submit(text="start")
    assert run_drive(run_id=first.id).kind.value == "completed"
    checkpoints_before = Checkpoint.objects.filter(run__session_id=first.session_id).count()

    def send(i: int):
        return lambda: run_submit(tenant=tenant, agent="bot", input=f"next {i}", session=first.session_id)[0]

    results = race(*[send(i) for i in range(3)])
    started = [r for r in results if isinstance(r, Run)]
    refused = [r for r in results if isinstance(r, ActiveRunExists)]
    assert len(started) == 1 and len(refused) == 2, results
    assert refused[0].fields == {"session": ["has an active run"]}
    assert Run.objects.filter(session_id=first.session_id).count() == 2
    assert Checkpoint.objects.filter(run__session_id=first.session_id).count() == checkpoints_before + 1
