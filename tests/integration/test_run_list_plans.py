"""The runs list's queries on a tenant with many runs (runs.services.run_list,
runs migration 0013): each filter's page is read through an index that
serves it, never a sequential scan of `runs`; the busiest filters walk their
index in the page's order (no sort of every match); the input-text search
reads at most SEARCH_WINDOW rows. Plans from the server (EXPLAIN) after
ANALYZE."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.clock import CLOCK
from runs.models import Agent, Run, Session
from runs.services import agent_load, run_list, tenant_create
from runs.services.run_list import run_filters_from, runs_filtered

pytestmark = pytest.mark.django_db

MANY = 6000


@pytest.fixture
def crowded(tenant, load_agent):
    """acme with MANY runs over a month: most COMPLETED, some FAILED and CANCELLED, a few waiting; an agent
    with a few of them; and another tenant beside it."""
    from django.contrib.auth import get_user_model

    busy = load_agent(name="busy")
    rare = load_agent(name="rare")
    others, _ = tenant_create(name="globex", username="bob")
    agent_load(
        tenant=others,
        definition={
            "name": "busy",
            "instructions": "x",
            "model": {"provider": "scripted", "turns": [{"text": "x"}]},
            "tools": [],
        },
    )
    agents = {a.name: a for a in Agent.objects.filter(tenant=tenant)}
    now = CLOCK.now()

    def status(i: int) -> str:
        return (
            "FAILED"
            if i % 40 == 0
            else "CANCELLED"
            if i % 97 == 0
            else "WAITING_FOR_USER"
            if i % 500 == 0
            else "COMPLETED"
        )

    sessions = Session.objects.bulk_create([Session(tenant=tenant, agent=agents["busy"]) for _ in range(MANY)])
    Run.objects.bulk_create(
        [
            Run(
                tenant=tenant,
                session=session,
                agent=agents["rare"] if i % 300 == 0 else agents["busy"],
                agent_version=busy.version if i % 300 else rare.version,
                status=status(i),
                input=f"deploy service {i} to region {i % 7}",
                created_at=now - timedelta(minutes=7 * i),
                updated_at=now - timedelta(minutes=7 * i - 1),
            )
            for i, session in enumerate(sessions)
        ],
        batch_size=2000,
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE runs")
        cursor.execute("ANALYZE agents")
        cursor.execute("ANALYZE approvals")
    return get_user_model().objects.get(username="alice")


def plan(user, **params) -> str:
    qs = runs_filtered(user=user, filters=run_filters_from(params)).order_by("-created_at", "-id")[
        : run_list.PAGE_SIZE + 1
    ]
    sql, args = qs.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql, args)
        return "\n".join(row[0] for row in cursor.fetchall())


# The partial indexes that hold only the runs that have not ended: a few rows in a tenant of many.
# A live status is read by one of the live runs' indexes, or by the (status, priority, created_at) one: each reads
# the live runs (a handful), never the tenant's history; which one the planner takes depends on its statistics.
ACTIVE = ("runs_active_tenant_idx", "one_active_run_per_session", "runs_live_deadline_idx", "runs_status_queue_idx")


def assert_indexed(text: str, index: str | tuple[str, ...], *, ordered: bool) -> None:
    assert "Seq Scan on runs" not in text, text
    assert any(name in text for name in ((index,) if isinstance(index, str) else index)), text
    if ordered:  # walked in the page's order: at most an incremental sort on the id, the tie-breaker
        assert "  Sort  " not in text and "-> Sort" not in text, text


def test_each_filter_reads_its_page_through_an_index(crowded):
    alice = crowded
    assert_indexed(plan(alice), "runs_tenant_created_idx", ordered=True)
    assert_indexed(plan(alice, since="24h"), "runs_tenant_created_idx", ordered=True)
    assert_indexed(plan(alice, status="FAILED"), "runs_tenant_ended_badly_idx", ordered=True)
    assert_indexed(plan(alice, status="CANCELLED"), "runs_tenant_ended_badly_idx", ordered=True)
    assert_indexed(plan(alice, status="WAITING_FOR_USER"), ACTIVE, ordered=False)
    assert_indexed(plan(alice, waiting_on="approval"), ACTIVE, ordered=False)
    assert_indexed(plan(alice, waiting_on="user"), ACTIVE, ordered=False)
    assert_indexed(plan(alice, agent="rare"), "runs_agent_created_idx", ordered=True)
    assert "Seq Scan on runs" not in plan(alice, status="COMPLETED", since="7d")


def test_the_input_search_reads_a_bounded_window(crowded, monkeypatch):
    """A tenant's history is many times the window (here MANY runs against a window of 500, as a tenant
    of a million runs against the 5,000 of the default): the window is a walk of the (tenant, created)
    index that stops after it, and only its rows' text is compared."""
    monkeypatch.setattr(run_list, "SEARCH_WINDOW", 500)
    alice = crowded
    text = plan(alice, q="region 3")
    assert "Seq Scan on runs" not in text, text
    with CaptureQueriesContext(connection) as statements:
        found = list(
            runs_filtered(user=alice, filters=run_filters_from({"q": "region 3"})).values_list("id", flat=True)
        )
    windows = [s["sql"] for s in statements.captured_queries if "SELECT w.id FROM" in s["sql"]]
    assert len(windows) == 1, statements.captured_queries
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + windows[0])
        window = "\n".join(row[0] for row in cursor.fetchall())
    # The text is compared on the window's rows only: LIMIT SEARCH_WINDOW over the (tenant, created) index.
    assert "Limit  (cost" in window and "runs_tenant_created_idx" in window, window
    assert "Seq Scan on runs" not in window, window
    assert f"LIMIT {run_list.SEARCH_WINDOW}" in windows[0]
    assert 0 < len(found) <= run_list.SEARCH_WINDOW
    oldest = Run.objects.filter(tenant__name="acme").order_by("created_at").first()
    assert not runs_filtered(user=alice, filters=run_filters_from({"q": oldest.input})).filter(id=oldest.id).exists()
    assert runs_filtered(user=alice, filters=run_filters_from({"q": str(oldest.id)})).get().id == oldest.id


def test_like_wildcards_in_the_search_are_text(tenant, load_agent, submit):
    from django.contrib.auth import get_user_model

    load_agent()
    percent, plain = submit(text="100% done"), submit(text="1000 done")
    alice = get_user_model().objects.get(username="alice")
    assert [r.id for r in runs_filtered(user=alice, filters=run_filters_from({"q": "0% d"}))] == [percent.id]
    assert not runs_filtered(user=alice, filters=run_filters_from({"q": "1_00"})).exists()
    assert plain.id in {r.id for r in runs_filtered(user=alice, filters=run_filters_from({"q": "000 D"}))}
