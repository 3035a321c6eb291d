"""Fair workers (issue 34 item 5) through a real `qcluster`: one tenant floods
both workers with four runs at a share of one lease; another tenant's run is
claimed while the flood still runs, and the flooding tenant never holds two
leases at once. The review's figure was another tenant's run waiting 39.5 s
behind four sleep(20) runs; bench/fairness.py measures it.

Every run pauses at its model call (fault point `model.before_call=pause`)
until the test lets it go, so what is claimed when is decided by the runtime
alone, never by how long a run takes. No `run_maintenance` runs: a run of the
flood that a claim left queued is claimed only because a release of its
tenant rang its doorbell (runs/runtime/queue.py, ring_for_queued)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runs.models import Event, Run
from runs.services import agent_load, run_submit, tenant_create
from tests.conftest import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

FLOOD = 4
POINT = "model.before_call"
RELEASES = ("run.completed", "run.failed", "run.cancelled", "run.requeued", "run.waiting_for_approval")


class Pauses:
    """The fault point's files (runs/runtime/faults.py): who is paused, and the `go` that lets it continue."""

    def __init__(self, folder: Path):
        self.folder = folder

    def paused(self, run_id) -> bool:
        return (self.folder / f"{POINT}.{run_id}.paused").exists()

    def release_all(self) -> None:
        for paused in self.folder.glob(f"{POINT}.*.paused"):
            (self.folder / paused.name.replace(".paused", ".go")).touch()


def status(run_id) -> str:
    return Run.objects.filter(id=run_id).values_list("status", flat=True).get()


def leases(run_id) -> list[tuple]:
    """The run's leases from its events: (claimed at, released at) for each claim."""
    spans, start = [], None
    for kind, at in Event.objects.filter(run_id=run_id).order_by("sequence").values_list("type", "occurred_at"):
        if kind == "run.claimed":
            start = at
        elif kind in RELEASES and start is not None:
            spans.append((start, at))
            start = None
    return spans


def most_held_at_once(spans: list[tuple]) -> int:
    """The largest number of the spans open at one moment. A release's event is stamped before its commit
    and the next claim's after the claim saw that commit, so spans that merely follow each other never
    overlap here."""
    points = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda p: (p[0], p[1]))
    held = most = 0
    for _, step in points:
        held += step
        most = max(most, held)
    return most


def test_a_flooding_tenant_holds_its_share_and_another_tenants_run_is_claimed_meanwhile(
    cluster, load_agent, submit, tmp_path
):
    load_agent(turns=[{"text": "flood"}])
    other, _ = tenant_create(name="globex", username="bob", password="pw")
    agent_load(
        tenant=other,
        definition={
            "name": "bot",
            "instructions": "test agent",
            "model": {"provider": "scripted", "turns": [{"text": "mine"}]},
            "tools": ["echo"],
        },
    )
    pauses = Pauses(tmp_path)
    c = cluster(
        AGENTRT_WORKERS=2,
        AGENTRT_TENANT_MAX_RUNNING=1,
        AGENTRT_ENABLE_FAULTPOINTS=1,
        AGENTRT_FAULTPOINTS=f"{POINT}=pause",
        AGENTRT_FAULTPOINT_DIR=tmp_path,
    )
    flood = [submit(text=f"flood {i}") for i in range(FLOOD)]
    wait_for(
        lambda: any(pauses.paused(r.id) for r in flood), timeout=60, message=f"the flood's first run\n{c.output()}"
    )
    theirs, _ = run_submit(tenant=other, agent="bot", input="another tenant's run")

    # The other worker is free: another tenant's run is claimed (and reaches its model call) — unless the
    # flood took that worker too.
    def theirs_or_a_second_flood_run():
        return pauses.paused(theirs.id) or sum(pauses.paused(r.id) for r in flood) > 1

    wait_for(theirs_or_a_second_flood_run, timeout=60, message=f"a second claim\n{c.output()}")
    held = [r.id for r in flood if pauses.paused(r.id)]
    assert len(held) == 1, f"the flooding tenant holds {len(held)} leases at a share of 1"
    assert pauses.paused(theirs.id)
    assert sorted(status(r.id) for r in flood) == ["QUEUED"] * (FLOOD - 1) + ["RUNNING"]

    def everything_ended():
        pauses.release_all()  # each run as it reaches its model call
        return all(status(r) == "COMPLETED" for r in [*(f.id for f in flood), theirs.id])

    wait_for(everything_ended, timeout=120, message=f"every run to complete\n{c.output()}")

    spans = [span for r in flood for span in leases(r.id)]
    assert len(spans) == FLOOD
    assert most_held_at_once(spans) == 1, spans
    # Another tenant's run was claimed before the flood's second.
    [(theirs_claimed, _)] = leases(theirs.id)
    assert theirs_claimed < sorted(a for a, _ in spans)[1]
