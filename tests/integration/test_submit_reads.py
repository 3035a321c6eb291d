"""A submit is the first stretch of submit -> first model call (issue 16 item 4):
it reads the agent and its latest version in one statement, and a run in a
new session reads no session history (there is none); a run that continues
a session is still seeded with what the session said before."""

from __future__ import annotations

from unittest.mock import patch

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from checkpoints.repository import checkpoint_latest
from runs.errors import AgentNotFound
from runs.runtime.executor import run_drive

pytestmark = pytest.mark.django_db(transaction=True)


def reads(queries) -> list[str]:
    return [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("SELECT")]


def test_a_submit_reads_the_agent_once_and_no_history_for_a_new_session(load_agent, submit):
    load_agent(turns=[{"text": "hi"}])
    submit(text="warm")  # the tenant's first submit
    with CaptureQueriesContext(connection) as q:
        submit(text="hello")
    selects = reads(q.captured_queries)
    agent_reads = [s for s in selects if '"agents"' in s or '"agent_versions"' in s]
    assert len(agent_reads) == 1 and 'FROM "agent_versions" INNER JOIN "agents"' in agent_reads[0], agent_reads
    history = [s for s in selects if 'FROM "runs"' in s and '"runs"."session_id"' in s]
    assert history == [], history


def test_a_run_that_continues_a_session_is_seeded_with_the_sessions_history(load_agent, submit):
    load_agent(turns=[{"text": "first answer"}])
    first = submit(text="first question")
    assert run_drive(run_id=first.id).kind.value == "completed"
    second = submit(text="second question", session=first.session_id)
    assert [(m["role"], m["content"]) for m in checkpoint_latest(second.id).conversation] == [
        ("user", "first question"),
        ("assistant", "first answer"),
        ("user", "second question"),
    ]


def test_an_unknown_agent_is_refused_naming_the_field(load_agent, submit):
    load_agent()
    with pytest.raises(AgentNotFound) as caught:
        submit(agent="ghost")
    assert caught.value.fields == {"agent": ["unknown agent"]}


def _reads_until_the_first_model_call(run_id) -> list[str]:
    """The SELECTs a worker makes from its claim up to the run's first model call."""
    from runs.providers.scripted import ScriptedProvider

    seen: list[str] = []
    original = ScriptedProvider.complete

    def complete(self, *args, **kwargs):
        if not seen:
            seen.extend(reads(q.captured_queries))
        return original(self, *args, **kwargs)

    with patch.object(ScriptedProvider, "complete", complete), CaptureQueriesContext(connection) as q:
        assert run_drive(run_id=run_id).kind.value == "completed"
    return seen


def test_a_runs_first_lease_reads_neither_its_log_nor_its_calls_before_the_model(load_agent, submit):
    """On the first claim (epoch 1) nothing but the submit has written the run:
    the worker reads its seed checkpoint and goes on, with no catch-up over the
    log, no count of calls that ran and no earlier attempt to look for."""
    load_agent(turns=[{"text": "hi"}])
    run = submit(text="hello")
    selects = _reads_until_the_first_model_call(run.id)
    assert any('FROM "checkpoints"' in s for s in selects), selects
    for table in ('"events"', '"tool_invocations"', '"model_calls"'):
        assert not any(f"FROM {table}" in s for s in selects), (table, selects)


def test_a_run_taken_over_still_catches_up_with_its_log_and_counts_its_calls(load_agent, submit):
    """Epoch 2 or later: a worker may have written the run, so the state is
    caught up with the log and the calls that ran are counted, as before."""
    from runs.models import Run

    echo = {"tool_calls": [{"name": "echo", "arguments": {"text": "a"}}]}
    load_agent(turns=[echo, {"text": "done"}])
    run = submit(text="hello")
    Run.objects.filter(id=run.id).update(lease_epoch=1)  # as if an earlier lease had been taken over
    selects = _reads_until_the_first_model_call(run.id)
    assert any('FROM "tool_invocations"' in s for s in selects), selects
    assert any('FROM "model_calls"' in s for s in selects), selects


def test_the_claimed_run_its_pinned_definition_and_its_principal_are_one_read(load_agent, submit):
    """From the claim to the first model call the worker reads the run, its
    agent, the version it is pinned to and its principal's name in one
    statement (four ORM reads before), then its seed checkpoint: nothing else."""
    from django.contrib.auth import get_user_model

    from runs.store.repository import claimed_run

    load_agent(turns=[{"text": "hi"}])
    user = get_user_model().objects.get(username="alice")
    run = submit(text="hello", principal=user)
    load_agent(turns=[{"text": "a later version"}])  # the run stays pinned to the version it was submitted on
    row = claimed_run(run.id)
    assert (row.agent_name, row.principal_username) == ("bot", "alice")
    assert row.pinned_definition["model"]["turns"] == [{"text": "hi"}]
    selects = _reads_until_the_first_model_call(run.id)
    assert len(selects) == 2, selects
    assert "AS pinned_definition" in selects[0] and 'FROM "checkpoints"' in selects[1], selects
