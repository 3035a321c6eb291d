"""One object looked up in a user's tenant reads it by its primary key
whatever the statistics say (runs.services.scoping.scoped_one).

Narrowed by tenant first (`WHERE tenant_id = T AND id = X`), the lookup of
one run, approval, session or webhook subscription let the planner take the
tenant's index when the statistics were taken before the tenant had rows (a
tenant that grew since the last ANALYZE): every row of the tenant read to find
one, at each request, until the next ANALYZE. The statistics here are taken
while only another tenant has rows, then ours gets CROWD of each; each lookup
must read no index of its table but the primary key. Each also still answers
another tenant's id exactly as a missing one (the scope is now checked on
the row, after the read). Counted by the server: pg_stat_user_indexes."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.test import Client

from approvals.errors import ApprovalNotFound
from approvals.models import Approval
from approvals.services import approval_for
from runs.errors import InvalidInput, RunNotFound
from runs.models import Run, Session
from runs.services import agent_load, run_submit, scoping, tenant_create
from tests.pgstats import counts, read_during
from webhooks.models import WebhookSubscription
from webhooks.services import SubscriptionNotFound, subscription_for

pytestmark = pytest.mark.django_db(transaction=True)

CROWD = 300
TABLES = ("runs", "approvals", "sessions", "webhook_subscriptions")


def tenant_indexes(table: str) -> set[str]:
    """The indexes of `table` that lead with the tenant. (Other indexes may
    show a read or two: the planner probes an index's first and last entries
    when it estimates a join over its column.)"""
    found = {
        name
        for (name,) in counts(
            "SELECT indexname FROM pg_indexes WHERE tablename = %s AND indexdef LIKE %s", [table, "%(tenant_id%"]
        )
    }
    assert found, f"{table} has no index that leads with the tenant: this test would prove nothing"
    return found


def fill(tenant, agent, n: int) -> dict[str, list]:
    """`n` ended runs of `tenant`, each in a session of its own and with an
    approval, and `n` webhook subscriptions."""
    sessions = Session.objects.bulk_create([Session(tenant=tenant, agent=agent) for _ in range(n)])
    runs = Run.objects.bulk_create(
        [
            Run(tenant=tenant, session=s, agent=agent, agent_version=1, status="COMPLETED", input="crowd")
            for s in sessions
        ]
    )
    approvals = Approval.objects.bulk_create(
        [Approval(tenant=tenant, run=r, kind="policy", request_hash="0" * 64, status="approved") for r in runs]
    )
    subscriptions = WebhookSubscription.objects.bulk_create(
        [WebhookSubscription(tenant=tenant, url=f"https://hooks.example/{i}", secret_encrypted="x") for i in range(n)]
    )
    return {"runs": runs, "approvals": approvals, "sessions": sessions, "webhook_subscriptions": subscriptions}


@pytest.fixture
def grown(tenant, load_agent, operator):
    """Statistics taken while only another tenant had rows; then ours grows."""
    other, _ = tenant_create(name="other", username="olga", password="pw")
    other_agent = agent_load(
        tenant=other,
        definition={"name": "bot", "instructions": "x", "model": {"provider": "scripted", "turns": []}, "tools": []},
    ).agent
    theirs = fill(other, other_agent, CROWD)
    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"ANALYZE {table}")
    ours = fill(tenant, load_agent().agent, CROWD)
    return ours, theirs


def _run(user, key):
    return scoping.run_visible(user, key)


def _run_acting(user, key):
    return scoping.run_actionable(user, key)


def _approval(user, key):
    return approval_for(user=user, approval_id=key, acting=True)


def _subscription(user, key):
    return subscription_for(user=user, subscription_id=key)


def _session(user, key):
    """A submit that continues the session (the session is read in the submit's tenant)."""
    run, _ = run_submit(tenant=scoping.tenant_for(user), agent="bot", input="again", session=key)
    return run.session


LOOKUPS = {  # table, lookup, what a missing object raises (and says)
    "run (seen)": ("runs", _run, RunNotFound, "no such run"),
    "run (acted on)": ("runs", _run_acting, RunNotFound, "no such run"),
    "approval": ("approvals", _approval, ApprovalNotFound, "no such approval"),
    "webhook subscription": ("webhook_subscriptions", _subscription, SubscriptionNotFound, "no such webhook"),
    "session": ("sessions", _session, InvalidInput, "unknown session"),
}


@pytest.mark.parametrize("lookup", list(LOOKUPS))
def test_one_object_in_a_grown_tenant_is_read_by_key(grown, operator, lookup):
    table, find, missing, says = LOOKUPS[lookup]
    ours, theirs = grown
    target = ours[table][CROWD // 2]
    read = read_during(lambda: find(operator, target.id), table)
    # before: CROWD entries of the tenant's index (runs_tenant_created_idx,
    # approvals_tenant_id_…, sessions_tenant_id_…, webhook_subs_tenant_idx)
    assert not tenant_indexes(table) & set(read), read
    assert "(sequential)" not in read, read
    assert read.get(f"{table}_pkey", 0) > 0, read
    with pytest.raises(missing, match=says):  # another tenant's object, by its real id: as if it did not exist
        find(operator, theirs[table][0].id)
    with pytest.raises(missing, match=says):
        find(operator, uuid.uuid4())


def test_the_admin_reads_one_object_by_key_and_hides_another_tenants(grown, operator):
    ours, theirs = grown
    client = Client()
    client.force_login(operator)
    target = ours["runs"][CROWD // 2]
    holder: dict = {}

    def page():
        holder["response"] = client.get(f"/admin/runs/run/{target.id}/change/")

    read = read_during(page, "runs")
    assert holder["response"].status_code == 200
    assert not tenant_indexes("runs") & set(read), read
    assert read.get("runs_pkey", 0) > 0, read
    assert client.get(f"/admin/runs/run/{theirs['runs'][0].id}/change/").status_code == 404
    assert client.get(f"/admin/approvals/approval/{theirs['approvals'][0].id}/change/").status_code == 404
    assert client.get("/admin/runs/run/not-a-uuid/change/").status_code in (302, 404)
