"""The doorbell broker in this process, against the real queue table: it
keeps delivering when LISTEN is impossible (the server refuses the extra
connection), and it does not retry LISTEN on every poll, which would also
log a warning 50 times a second. NOTIFY waking a real cluster is
tests/e2e/test_doorbell.py."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from django.utils import timezone
from django_q.conf import Conf

from runs.runtime.doorbell import DoorbellORM
from tests.conftest import race

pytestmark = pytest.mark.django_db(transaction=True)


def test_without_a_listener_the_broker_polls_and_retries_listen_only_after_a_pause(monkeypatch):
    attempts = []
    real_connect = psycopg.connect

    def refuse_the_listener(*args, **kwargs):
        if "cursor_factory" in kwargs:  # Django's own connections still open
            return real_connect(*args, **kwargs)
        attempts.append(kwargs.get("dbname"))
        raise psycopg.OperationalError("too many clients already")

    monkeypatch.setattr(psycopg, "connect", refuse_the_listener)
    broker = DoorbellORM(list_key="doorbell-test")
    broker.enqueue("first")
    assert [payload for _, payload in broker.dequeue()] == ["first"]
    assert broker.dequeue() is None  # empty: one short poll, no listener
    broker.enqueue("second")
    assert [payload for _, payload in broker.dequeue()] == ["second"]
    assert len(attempts) == 1  # LISTEN was tried once, then left alone for LISTEN_RETRY_SECONDS


def test_racing_pushers_take_each_task_once():
    """Two clusters' pushers reading the queue at the same moment: each task
    goes to exactly one of them (the take is one UPDATE over rows locked
    with SKIP LOCKED and re-checked as due)."""
    brokers = [DoorbellORM(list_key="doorbell-race") for _ in range(2)]
    for round_ in range(20):
        brokers[0].enqueue(f"task {round_}")
        taken = [[payload for _, payload in took] for took in race(*[b._take for b in brokers])]
        assert sorted(len(t) for t in taken) == [0, 1], taken
        assert taken[0] + taken[1] == [f"task {round_}"]


def test_a_taken_task_is_due_again_only_after_its_lock_lapses():
    from django_q.models import OrmQ

    broker = DoorbellORM(list_key="doorbell-lock")
    broker.enqueue("one")
    broker.enqueue("two")
    assert [payload for _, payload in broker._take()] == ["one"]  # Q_CLUSTER bulk 1, oldest first
    assert [payload for _, payload in broker._take()] == ["two"]
    assert broker._take() == []  # both locked `retry` seconds ahead
    row = OrmQ.objects.get(key="doorbell-lock", payload="one")
    assert row.lock > timezone.now() + timedelta(seconds=Conf.RETRY - 60)
    OrmQ.objects.filter(pk=row.pk).update(lock=timezone.now() - timedelta(seconds=1))  # its worker died
    assert [payload for _, payload in broker._take()] == ["one"]
    assert [payload for _, payload in DoorbellORM(list_key="another-cluster")._take()] == []  # keys apart


def test_an_enqueue_rings_once_when_its_transaction_commits_and_not_before():
    """The row and the NOTIFY are one statement in the caller's transaction:
    a listener hears nothing while it is open, one notification at commit,
    and a rolled-back enqueue leaves neither a row nor a ring."""
    from django.db import transaction
    from django_q.models import OrmQ

    from runs.runtime.doorbell import CHANNEL, listen_connection

    broker = DoorbellORM(list_key="doorbell-ring")
    with listen_connection() as listener:
        with transaction.atomic():
            pk = broker.enqueue("rung")
            assert list(listener.notifies(timeout=0.2)) == []  # not while the transaction is open
        heard = list(listener.notifies(timeout=5, stop_after=1)) + list(listener.notifies(timeout=0.2))
        assert [n.channel for n in heard] == [CHANNEL]
        assert OrmQ.objects.get(pk=pk).payload == "rung"

        class Abandon(Exception):
            pass

        with pytest.raises(Abandon), transaction.atomic():
            broker.enqueue("abandoned")
            raise Abandon
        assert list(listener.notifies(timeout=0.5)) == []
        assert not OrmQ.objects.filter(key="doorbell-ring", payload="abandoned").exists()
