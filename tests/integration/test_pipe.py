"""The worker connection's pipeline (runs/store/repository.py `_Pipe`): units
sent one behind the other are transactions of their own, in order; a unit
that cannot be sent leaves the connection usable and out of pipeline mode."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.db import DatabaseError, connection

from runs.domain.errors import WorkerFenced
from runs.domain.writes import UnitOfWork
from runs.store.repository import _InFlight, _Pipe

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def connected():
    connection.ensure_connection()  # the store's send does, through its checks


def store():
    return SimpleNamespace(_in_flight=None, _record_committed=lambda work, seqs, floor, starts: seqs)


def out_of_pipeline_mode() -> bool:
    raw = connection.connection
    return raw._pipeline is None and raw.pgconn.pipeline_status == 0 and connection.execute_wrappers == []


def test_a_unit_behind_a_failing_one_runs_in_a_transaction_of_its_own():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE pipe_probe (v int)")
    pipe = _Pipe(connection)
    first = _InFlight(store(), pipe, UnitOfWork(), None, "SELECT 1 / (%s - 1), NULL::bigint[], NULL::jsonb", [1])
    second = _InFlight(
        store(),
        pipe,
        UnitOfWork(),
        None,
        "WITH w AS (INSERT INTO pipe_probe VALUES (%s) RETURNING 1) SELECT (SELECT count(*) FROM w),"
        " ARRAY[7]::bigint[], NULL::jsonb",
        [7],
    )
    with pytest.raises(DatabaseError, match="division by zero"):
        first.wait()
    with pytest.raises(DatabaseError, match="division by zero"):
        first.wait()  # every later call raises it again
    assert second.wait() == [7]  # not skipped: a Sync separates the two
    assert out_of_pipeline_mode()
    with connection.cursor() as cursor:
        cursor.execute("SELECT v FROM pipe_probe")
        assert cursor.fetchall() == [(7,)]  # committed on its own


def test_a_unit_that_matches_no_row_is_fenced_and_the_connection_is_left_clean():
    pipe = _Pipe(connection)
    unit = _InFlight(store(), pipe, UnitOfWork(), None, "SELECT 0, NULL::bigint[], NULL::jsonb", [])
    with pytest.raises(WorkerFenced):
        unit.wait()
    assert out_of_pipeline_mode()


def test_a_unit_that_cannot_be_sent_leaves_the_connection_usable():
    pipe = _Pipe(connection)
    with pytest.raises(Exception, match="cannot adapt"):
        _InFlight(store(), pipe, UnitOfWork(), None, "SELECT %s", [object()])
    assert out_of_pipeline_mode()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


def test_a_django_query_while_a_unit_is_in_flight_raises_instead_of_waiting_on_itself():
    pipe = _Pipe(connection)
    unit = _InFlight(store(), pipe, UnitOfWork(), None, "SELECT 1, NULL::bigint[], NULL::jsonb", [])
    with pytest.raises(RuntimeError, match="unit in flight"):
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    assert unit.wait() == []
    assert out_of_pipeline_mode()
