"""The fenced statements are prepared on PostgreSQL; the ORM's are not, and
AGENTRT_PG_PREPARE=0 turns preparing off (transaction-mode poolers)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.db import connection

from runs.models import Event, Run
from runs.runtime.executor import run_drive
from runs.store.cursor import statement_cursor
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db(transaction=True)


def echo(text):
    return {"tool_calls": [{"name": "echo", "arguments": {"text": text}}]}


def prepared_fenced_statements() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def test_a_run_prepares_its_fenced_statements_once_per_shape(load_agent, submit):
    load_agent(turns=[echo("a"), echo("b"), echo("c"), echo("d"), {"text": "done"}])
    run = submit()
    before = prepared_fenced_statements()
    outcome = run_drive(run_id=run.id)
    assert outcome.kind.value == "completed"
    assert Run.objects.get(id=run.id).status == "COMPLETED"
    fenced = [s for s in prepared_fenced_statements() if s.startswith("WITH fenced_run AS") and s not in before]
    # Both per-step shapes (model response + decisions; results + checkpoint + next request) ran
    # more than once and are prepared; none is prepared twice.
    assert len(fenced) >= 2
    assert len(fenced) == len(set(fenced))
    # The ORM's client-side binding never prepares.
    assert not [s for s in prepared_fenced_statements() if "django_" in s or '"runs"' in s]
    types = list(Event.objects.filter(run_id=run.id).order_by("sequence").values_list("type", flat=True))
    assert types.count("tool.call.completed") == 4 and types[-1] == "run.completed"


def test_without_a_prepare_threshold_the_statement_cursor_binds_on_the_client(load_agent, submit):
    from psycopg import ClientCursor

    connection.ensure_connection()
    raw = connection.connection
    saved = raw.prepare_threshold
    raw.prepare_threshold = None
    try:
        with statement_cursor() as cursor:
            assert isinstance(cursor.cursor, ClientCursor)
        load_agent(turns=[echo("a"), echo("b"), {"text": "done"}])
        run = submit()
        before = set(prepared_fenced_statements())
        assert run_drive(run_id=run.id).kind.value == "completed"
        assert set(prepared_fenced_statements()) == before
    finally:
        raw.prepare_threshold = saved
    with statement_cursor() as cursor:
        assert not isinstance(cursor.cursor, ClientCursor)


@pytest.mark.parametrize("value, expected", [("0", "None"), ("1", "1"), (None, "1")])
def test_agentrt_pg_prepare_sets_the_connection_option(value, expected):
    env = {k: v for k, v in os.environ.items() if k != "AGENTRT_PG_PREPARE"}
    if value is not None:
        env["AGENTRT_PG_PREPARE"] = value
    env["DJANGO_SETTINGS_MODULE"] = "agentrt_site.settings"
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from django.conf import settings; print(settings.DATABASES['default']['OPTIONS']['prepare_threshold'])",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == expected
