"""`runs.services.wait_for_run` (issue 13, item 7): code in the same Django
project submits with `run_submit` and waits for a real `qcluster` to settle
the run."""

from __future__ import annotations

import pytest
from django.db import transaction

from runs.services import RunWaitTimeout, run_submit, wait_for_run

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_waits_until_the_run_ends_or_waits_for_a_person(tenant, load_agent, cluster):
    load_agent(name="quick", turns=[{"text": "done"}])
    load_agent(
        name="asker",
        turns=[{"tool_calls": [{"name": "ask_user", "arguments": {"question": "which one?"}}]}],
        tools=("ask_user",),
    )
    quick, _ = run_submit(tenant=tenant, agent="quick", input="hi")
    with pytest.raises(RunWaitTimeout, match="still QUEUED"):  # no worker yet
        wait_for_run(quick.id, timeout=0.3)
    cluster(AGENTRT_LEASE_SECONDS=5)
    assert wait_for_run(quick.id, timeout=90).status == "COMPLETED"
    asker, _ = run_submit(tenant=tenant, agent="asker", input="pick")
    assert wait_for_run(asker, timeout=90).status == "WAITING_FOR_USER"
    with pytest.raises(RunWaitTimeout):  # asked to wait for the end only
        wait_for_run(asker.id, timeout=0.5, waiting=False)


def test_refuses_to_wait_inside_a_transaction(tenant, load_agent):
    load_agent(name="quick", turns=[{"text": "done"}])
    run, _ = run_submit(tenant=tenant, agent="quick", input="hi")
    with transaction.atomic():
        with pytest.raises(RuntimeError, match="inside a transaction"):
            wait_for_run(run.id, timeout=1)
