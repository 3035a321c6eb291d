"""The parsed-argument redaction pass (runs/domain/pipeline/decide.py `_resolve`:
`entry.arguments = scrub(parsed)`): a secret the model wrote with a JSON
escape (`"sk-\\u0041..."`) is not a secret to the scrub of the raw text —
the pattern does not match `sk-\\u0041` — but it is one once the arguments
are parsed. A run is driven in-process through the real store on PostgreSQL
with such a call, then every row of every table is searched for the decoded
secret: it must be nowhere (tests/mutants/parsed_arguments_not_scrubbed.toml
skips the pass)."""

from __future__ import annotations

import json

import pytest
from django.db import connection

from runs.models import Event, Run, ToolInvocation
from runs.runtime.executor import run_drive

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "sk-ABCDEFGHIJKLMNOPQRSTUVWX"  # the decoded canary: a real instance of the sk- shape
ESCAPED = "sk-\\u0041BCDEFGHIJKLMNOPQRSTUVWX"  # how the model wrote it, inside a JSON string
MARKER = "plain-marker-h1"


def rows_holding(text: str) -> dict[str, int]:
    """Every table of the schema whose rows, as text, contain `text`."""
    found = {}
    with connection.cursor() as cur:
        cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename")
        for (table,) in cur.fetchall():
            cur.execute(f'SELECT count(*) FROM "{table}" AS t WHERE strpos(t::text, %s) > 0', [text])
            n = cur.fetchone()[0]
            if n:
                found[table] = n
    return found


def test_a_json_escaped_secret_in_raw_arguments_persists_nowhere(load_agent, submit):
    raw = f'{{"text": "{MARKER} {ESCAPED}"}}'
    assert SECRET not in raw and json.loads(raw) == {"text": f"{MARKER} {SECRET}"}
    load_agent(turns=[{"tool_calls": [{"name": "echo", "arguments": raw}]}, {"text": "done"}])
    run = submit()
    run_drive(run_id=run.id)
    assert Run.objects.get(id=run.id).status == "COMPLETED"
    inv = ToolInvocation.objects.get(run_id=run.id)
    # the arguments were parsed, persisted (the marker is there) and redacted
    assert inv.arguments == {"text": f"{MARKER} [REDACTED]"}, inv.arguments
    proposed = Event.objects.get(run_id=run.id, type="tool.call.proposed").payload
    assert proposed["arguments"] == {"text": f"{MARKER} [REDACTED]"}, proposed
    assert rows_holding(MARKER)  # the search reads what was persisted
    assert rows_holding(SECRET) == {}
    # Nor in the model's spelling: the raw arguments (a text column) and the turn's event hold no part of it.
    # (agent_versions holds the scripted model's turns: the test's input, not what the run persisted)
    assert set(rows_holding(SECRET[4:])) <= {"agent_versions"}
    assert json.loads(inv.raw_arguments) == {"text": f"{MARKER} [REDACTED]"}
