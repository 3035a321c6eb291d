"""A submit is the first stretch of submit -> first model call (issue 16 item 4):
it reads the agent and its latest version in one statement, and a run in a
new session reads no session history (there is none); a run that continues
a session is still seeded with what the session said before."""

from __future__ import annotations

import contextlib
import re
from unittest.mock import patch

import pytest
from django.db import connection

from checkpoints.repository import checkpoint_latest
from runs.errors import AgentNotFound
from runs.runtime.executor import run_drive

pytestmark = pytest.mark.django_db(transaction=True)


@contextlib.contextmanager
def statements():
    """The SQL this thread's connection is sent, as written (Django's query log
    has no text for the prepared statements of the store's statement cursor)."""
    sent: list[str] = []

    def record(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield sent


def reads(sent) -> list[str]:
    """The SELECTs, with identifiers unquoted (the ORM quotes them, hand-written SQL may not)."""
    return [sql.replace('"', "") for sql in sent if sql.lstrip().upper().startswith("SELECT")]


def test_a_submit_reads_the_agent_once_and_no_history_for_a_new_session(load_agent, submit):
    load_agent(turns=[{"text": "hi"}])
    submit(text="warm")  # the tenant's first submit
    with statements() as sent:
        submit(text="hello")
    selects = reads(sent)
    agent_reads = [s for s in selects if re.search(r"\bagent(s|_versions)\b", s)]
    assert len(agent_reads) == 1 and "JOIN agent_versions" in agent_reads[0], agent_reads
    history = [s for s in selects if "FROM runs" in s and "runs.session_id" in s]
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


def test_the_principals_permissions_read_in_one_statement_are_djangos(tenant, settings):
    """The permissions stamped on a run (seed 002's scope set) are read in one
    hand-written statement: the same set as Django's two queries for a user
    with permissions of their own and through groups (overlapping), for a
    superuser (every permission), an inactive user (none) and a user with
    none; with another backend granting permissions, the backends are asked."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group, Permission
    from django.utils.functional import SimpleLazyObject

    from runs.store.auth import granted_permissions

    User = get_user_model()
    publish, resolve, view_run = (
        Permission.objects.get(codename=c) for c in ("publish_agent", "resolve_approval", "view_run")
    )
    group, other = Group.objects.create(name="ops"), Group.objects.create(name="viewers")
    group.permissions.add(publish, resolve)
    other.permissions.add(view_run)
    mixed = User.objects.create_user("mixed")
    mixed.user_permissions.add(publish)  # also through the group
    mixed.groups.add(group, other)
    boss = User.objects.create_superuser("boss", password="x")
    gone = User.objects.create_user("gone", is_active=False)
    gone.groups.add(group)
    nobody = User.objects.create_user("nobody")

    for user in (mixed, boss, gone, nobody):
        fresh = User.objects.get(pk=user.pk)  # Django caches permissions on the instance
        with statements() as sent:
            mine = granted_permissions(fresh)
        assert mine == sorted(User.objects.get(pk=user.pk).get_all_permissions()), user.username
        assert len(sent) <= 1
    assert {"runs.publish_agent", "approvals.resolve_approval", "runs.view_run"} <= set(granted_permissions(mixed))
    assert len(granted_permissions(boss)) == Permission.objects.count()
    assert granted_permissions(gone) == [] and granted_permissions(nobody) == []
    # a session's request.user is a lazy object (the REST submit's case)
    assert granted_permissions(SimpleLazyObject(lambda: User.objects.get(pk=mixed.pk))) == granted_permissions(mixed)

    settings.AUTHENTICATION_BACKENDS = [*settings.AUTHENTICATION_BACKENDS, "tests.integration.test_submit_reads.Grants"]
    assert granted_permissions(User.objects.get(pk=nobody.pk)) == ["runs.granted_elsewhere"]


def test_the_members_tenant_read_by_hand_is_the_orms(tenant):
    """tenant_for (every API request's permission check) reads the member's
    tenant in one prepared statement: the same instance the ORM reads, JSON
    policy floor and quota included; no membership, no tenant."""
    from django.contrib.auth import get_user_model

    from runs.models import Tenant
    from runs.services import scoping
    from runs.services.tenants import tenant_configure

    floor = {"default": "allow", "rules": [{"tool": "http_post", "decision": "require_approval"}]}
    tenant_configure(tenant=tenant, policy_floor=floor, max_active_runs=7)
    alice = get_user_model().objects.get(username="alice")
    with statements() as sent:
        mine = scoping.tenant_for(alice)
    assert len(sent) == 1
    orm = Tenant.objects.get(id=tenant.id)
    assert [getattr(mine, f.attname) for f in Tenant._meta.concrete_fields] == [
        getattr(orm, f.attname) for f in Tenant._meta.concrete_fields
    ]
    assert mine.policy_floor["rules"][0]["decision"] == "require_approval" and mine.max_active_runs == 7
    assert (mine._state.adding, mine._state.db) == (False, "default")  # as the ORM's: saving updates the row
    mine.name = "renamed"
    mine.save(update_fields=["name"])
    assert Tenant.objects.get(id=tenant.id).name == "renamed"
    assert scoping.tenant_for(get_user_model().objects.create_user("loner")) is None


class Grants:
    """An authentication backend that grants one permission to everyone."""

    def authenticate(self, request, **credentials):
        return None

    def get_all_permissions(self, user_obj, obj=None):
        return {"runs.granted_elsewhere"}


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
            seen.extend(reads(sent))
        return original(self, *args, **kwargs)

    with patch.object(ScriptedProvider, "complete", complete), statements() as sent:
        assert run_drive(run_id=run_id).kind.value == "completed"
    return seen


def test_a_runs_first_lease_reads_neither_its_log_nor_its_calls_before_the_model(load_agent, submit):
    """On the first claim (epoch 1) nothing but the submit has written the run:
    the worker reads its seed checkpoint and goes on, with no catch-up over the
    log, no count of calls that ran and no earlier attempt to look for."""
    load_agent(turns=[{"text": "hi"}])
    run = submit(text="hello")
    selects = _reads_until_the_first_model_call(run.id)
    assert any("FROM checkpoints" in s for s in selects), selects
    for table in ("events", "tool_invocations", "model_calls"):
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
    assert any("FROM tool_invocations" in s for s in selects), selects
    assert any("FROM model_calls" in s for s in selects), selects


def test_the_claimed_run_its_pinned_definition_and_its_principal_are_one_read(load_agent, submit):
    """From the claim to the first model call the worker reads the run, its
    agent, the version it is pinned to and its principal's name in one
    statement (four ORM reads before), then its seed checkpoint: nothing else."""
    from django.contrib.auth import get_user_model

    from runs.store.reads import claimed_run

    load_agent(turns=[{"text": "hi"}])
    user = get_user_model().objects.get(username="alice")
    run = submit(text="hello", principal=user)
    load_agent(turns=[{"text": "a later version"}])  # the run stays pinned to the version it was submitted on
    row = claimed_run(run.id)
    assert (row.agent_name, row.principal_username) == ("bot", "alice")
    assert row.pinned_definition["model"]["turns"] == [{"text": "hi"}]
    selects = _reads_until_the_first_model_call(run.id)
    assert len(selects) == 2, selects
    assert "AS pinned_definition" in selects[0] and "FROM checkpoints" in selects[1], selects
