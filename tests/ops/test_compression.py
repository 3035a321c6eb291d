"""The JSON columns that carry tools' results and the model's output are
compressed with lz4 where the server offers it (ops/migrations/0005): pglz
cost a step whose tool returns 8 KiB about a third of a millisecond more
(bench/RESULTS.md, session 14). A value written under either reads back the same."""

from __future__ import annotations

import pytest
from django.db import connection

from runs.models import Event
from tests.ops.test_fleet import append, ev

pytestmark = pytest.mark.django_db

COLUMNS = (
    ("events", "payload"),
    ("tool_invocations", "result"),
    ("tool_invocations", "arguments"),
    ("checkpoints", "state"),
)


def test_the_large_json_columns_use_lz4_where_the_server_offers_it():
    with connection.cursor() as cur:
        cur.execute("SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'")
        offered = cur.fetchone()[0]
        for table, column in COLUMNS:
            cur.execute(
                "SELECT attcompression FROM pg_attribute WHERE attrelid = %s::regclass AND attname = %s",
                [table, column],
            )
            assert cur.fetchone()[0] == ("l" if offered else ""), (table, column)


def test_a_large_payload_reads_back_as_written(load_agent, submit):
    load_agent(name="bot")
    run = submit(agent="bot")
    text = " ".join(f"word{i}" for i in range(3000))  # ~26 KB: compressed and stored out of line
    append(run, ev("tool.call.completed", result=text))
    assert Event.objects.get(run_id=run.id, type="tool.call.completed").payload == {"result": text}
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pg_column_compression(payload) FROM events WHERE run_id = %s AND type = 'tool.call.completed'",
            [run.id],
        )
        assert cur.fetchone()[0] in ("lz4", "pglz")
