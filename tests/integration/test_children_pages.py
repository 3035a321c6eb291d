"""Child runs where people look (issue 15 §1): the live run page draws the
tree (parent chain and children with their status), escaped like everything
else on it; the admin links a run's parent and children; the runs list says
what a parent waits on."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from runs.models import Run
from runs.runtime.executor import run_drive
from runs.services import tenant_create

pytestmark = pytest.mark.django_db(transaction=True)

HOSTILE = "</script><script>window.__pwned=1</script><img src=x onerror=window.__pwned=2>"


@pytest.fixture
def family(load_agent, submit):
    """A lead waiting for two children; the first child itself waits for a grandchild."""
    load_agent(name="leaf", turns=[{"text": "leaf done"}])
    load_agent(
        name="middle",
        tools=("delegate_run",),
        delegates=["leaf"],
        turns=[{"tool_calls": [{"name": "delegate_run", "arguments": {"agent": "leaf", "input": HOSTILE}}]}],
    )
    load_agent(
        name="lead",
        tools=("delegate_run",),
        delegates=["middle", "leaf"],
        turns=[
            {
                "tool_calls": [
                    {"name": "delegate_run", "arguments": {"agent": "middle", "input": "plan " + HOSTILE}},
                    {"name": "delegate_run", "arguments": {"agent": "leaf", "input": "quick"}},
                ]
            }
        ],
    )
    lead = submit(agent="lead")
    run_drive(run_id=lead.id)
    middle, leaf = Run.objects.filter(parent=lead).order_by("created_at")
    run_drive(run_id=middle.id)
    grandchild = Run.objects.get(parent=middle)
    return lead, middle, leaf, grandchild


def viewer(tenant, username="viewer", staff=False):
    _, user = tenant_create(name=tenant.name, username=username, password="pw")
    if staff:
        user.is_staff = True
        user.save()
        user.user_permissions.add(*Permission.objects.filter(codename__in=["view_run"]))
    client = Client()
    client.force_login(user)
    return client


def test_the_run_page_draws_the_tree_of_child_runs_with_their_status(family, tenant):
    lead, middle, leaf, grandchild = family
    html = viewer(tenant).get(f"/runs/{lead.id}/").content.decode()

    nodes = re.findall(r'<li class="node depth-(\d)" data-node="([0-9a-f-]+)">', html)
    assert nodes == [("1", str(middle.id)), ("2", str(grandchild.id)), ("1", str(leaf.id))]
    assert f'<span class="badge s-WAITING_FOR_APPROVAL" data-run="{middle.id}">WAITING_FOR_APPROVAL</span>' in html
    assert f'<span class="badge s-QUEUED" data-run="{leaf.id}">QUEUED</span>' in html
    assert f'href="/runs/{grandchild.id}/"' in html
    # each child shows the agent version it was pinned to when it started
    assert f'title="the agent version pinned when it started">{middle.agent_version[:10]}</span>' in html


def test_a_child_page_names_the_runs_above_it(family, tenant):
    lead, middle, _, grandchild = family
    html = viewer(tenant).get(f"/runs/{grandchild.id}/").content.decode()

    chain = re.findall(r'<a class="mono" href="/runs/([0-9a-f-]+)/">', html.split('id="ancestors"', 1)[1])
    assert chain[:2] == [str(lead.id), str(middle.id)]


def test_a_childs_input_reaches_the_tree_only_escaped(family, tenant):
    lead, middle, _, _ = family
    for run in (lead, middle):
        html = viewer(tenant, username=f"v{run.id.hex[:6]}").get(f"/runs/{run.id}/").content.decode()
        assert "<script>window.__pwned" not in html and "<img" not in html
        assert "&lt;/script&gt;&lt;script&gt;window.__pwned=1" in html
        assert re.findall(r"<script\b[^>]*>", html)[-1] == '<script src="/static/runs/detail.js" defer>'


def test_another_tenants_member_sees_neither_the_tree_nor_a_child(family):
    lead, middle, *_ = family
    _, bob = tenant_create(name="globex", username="bob", password="pw")
    client = Client()
    client.force_login(bob)
    assert client.get(f"/runs/{lead.id}/").status_code == 404
    assert client.get(f"/runs/{middle.id}/").status_code == 404


def test_the_admin_links_a_run_to_its_parent_and_children(family, tenant):
    lead, middle, leaf, grandchild = family
    client = viewer(tenant, staff=True)

    lead_page = client.get(f"/admin/runs/run/{lead.id}/change/").content.decode()
    middle_page = client.get(f"/admin/runs/run/{middle.id}/change/").content.decode()

    for child in (middle, leaf):
        assert f'<a href="/admin/runs/run/{child.id}/change/">{child.id}</a>' in lead_page
    assert f'<a href="/admin/runs/run/{lead.id}/change/">{lead.id}</a>' in middle_page
    assert f'<a href="/admin/runs/run/{grandchild.id}/change/">{grandchild.id}</a>' in middle_page
    listing = client.get("/admin/runs/run/").content.decode()
    assert f'<a href="/admin/runs/run/{lead.id}/change/">{lead.id}</a>' in listing  # the children's parent column


def test_the_runs_list_says_a_parent_waits_on_child_runs(family, tenant):
    lead, *_ = family
    html = viewer(tenant).get("/runs/").content.decode()
    row = html.split(f'<tr data-run="{lead.id}">', 1)[1].split("</tr>", 1)[0]
    assert '<td data-field="waiting">child runs</td>' in row
