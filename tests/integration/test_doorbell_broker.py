"""The doorbell broker in this process, against the real queue table: it
keeps delivering when LISTEN is impossible (the server refuses the extra
connection), and it does not retry LISTEN on every poll, which would also
log a warning 50 times a second. NOTIFY waking a real cluster is
tests/e2e/test_doorbell.py."""

from __future__ import annotations

import psycopg
import pytest

from runs.runtime.doorbell import DoorbellORM

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
