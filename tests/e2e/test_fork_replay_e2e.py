"""Fork and replay through a real `qcluster` (issue 37's evidence): the effect
sink is the ground truth of what was sent. A run sends two effects; a fork
from step 1 never sends the first again and sends the second once, after a
person approved it; a replay with the same version completes sending nothing;
a replay with a version whose step-2 arguments differ fails
`replay_diverged`, sending nothing."""

from __future__ import annotations

import pytest

from approvals.models import Approval
from runs.models import Event, Run, ToolInvocation
from tests.api.conftest import token_client
from tests.conftest import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def post(sink, n):
    return {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"effect": n}}}]}


def bodies(sink):
    return [s["body"] for s in sink.sends]


def settled(run_id, *statuses):
    def check():
        return Run.objects.filter(id=run_id, status__in=statuses).exists()

    return check


@pytest.fixture
def original(cluster, load_agent, submit, sink):
    """A run that sent two effects (steps 1 and 2), on a running cluster."""
    version = load_agent(name="payer", turns=[post(sink, 1), post(sink, 2), {"text": "paid"}], tools=("http_post",))
    c = cluster(AGENTRT_LEASE_SECONDS=3, AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host)
    run = submit(agent="payer", text="pay twice")
    wait_for(settled(run.id, "COMPLETED", "FAILED"), timeout=60, message=f"the original to end\n{c.output()}")
    assert Run.objects.get(id=run.id).status == "COMPLETED"
    assert bodies(sink) == [{"effect": 1}, {"effect": 2}]
    return run, version, c


def test_a_fork_from_step_1_sends_the_first_effect_never_and_the_second_once_after_approval(original, sink, operator):
    run, _, c = original
    client = token_client(operator)
    response = client.post(f"/api/runs/{run.id}/fork/", {"from_step": 1}, format="json")
    assert response.status_code == 201, response.json()
    fork_id = response.json()["id"]
    wait_for(settled(fork_id, "WAITING_FOR_APPROVAL", "COMPLETED", "FAILED"), timeout=60, message=c.output())
    assert Run.objects.get(id=fork_id).status == "WAITING_FOR_APPROVAL"
    assert bodies(sink) == [{"effect": 1}, {"effect": 2}]  # the fork has sent nothing yet
    approval = Approval.objects.get(run_id=fork_id, status="pending")
    card = client.get(f"/api/approvals/{approval.id}/").json()["presentation"]
    assert card["fork"]["run"] == str(run.id) and card["fork"]["step"] == 1
    assert card["fork"]["same_tool"] and card["fork"]["same_arguments"]
    assert card["notice"].startswith(f"This run is a fork of run {run.id} at step 1")

    decided = client.post(
        f"/api/approvals/{approval.id}/approve/", {"request_hash": approval.request_hash}, format="json"
    )
    assert decided.status_code == 200, decided.json()
    wait_for(settled(fork_id, "COMPLETED", "FAILED"), timeout=60, message=c.output())
    fork = Run.objects.get(id=fork_id)
    assert fork.status == "COMPLETED" and fork.final_message == "paid"
    assert bodies(sink) == [{"effect": 1}, {"effect": 2}, {"effect": 2}]  # the second, once; the first, never again
    sent = ToolInvocation.objects.get(run_id=fork_id)
    assert sent.step_number == 2 and sink.count(sent.idempotency_key) == 1
    assert client.get(f"/api/runs/{run.id}/").json()["forks"][0]["id"] == fork_id
    # The fork went through the same machinery: claimed under a lease, fenced steps, its own events.
    types = list(Event.objects.filter(run_id=fork_id).order_by("sequence").values_list("type", flat=True))
    assert types[:3] == ["run.created", "run.claimed", "run.started"] and types[-1] == "run.completed"


def test_a_replay_with_the_same_version_completes_with_no_send(original, sink, operator):
    run, version, c = original
    response = token_client(operator).post(f"/api/runs/{run.id}/replay/", {}, format="json")
    assert response.status_code == 201, response.json()
    replay_id = response.json()["id"]
    wait_for(settled(replay_id, "COMPLETED", "FAILED", "WAITING_FOR_APPROVAL"), timeout=60, message=c.output())
    replay = Run.objects.get(id=replay_id)
    assert replay.status == "COMPLETED" and replay.final_message == "paid", replay.failure
    assert replay.agent_version == version.version and replay.replay_of_id == run.id
    assert bodies(sink) == [{"effect": 1}, {"effect": 2}]  # 0 sends
    answered = Event.objects.filter(run_id=replay_id, type="tool.call.completed")
    assert answered.count() == 2 and all(e.payload["replayed"] for e in answered)


def test_a_replay_whose_step_2_arguments_differ_fails_replay_diverged_with_no_send(
    original, sink, operator, load_agent
):
    run, _, c = original
    changed = load_agent(name="payer", turns=[post(sink, 1), post(sink, 3), {"text": "paid"}], tools=("http_post",))
    body = {"agent_version": str(changed.id)}  # the version's id, as the agents API shows it
    response = token_client(operator).post(f"/api/runs/{run.id}/replay/", body, format="json")
    assert response.status_code == 201, response.json()
    replay_id = response.json()["id"]
    wait_for(settled(replay_id, "COMPLETED", "FAILED", "WAITING_FOR_APPROVAL"), timeout=60, message=c.output())
    replay = Run.objects.get(id=replay_id)
    assert replay.status == "FAILED" and replay.failure["reason"] == "replay_diverged", replay.failure
    details = replay.failure["details"]
    assert details["step"] == 2 and details["reason"] == "different_call"
    assert details["original"]["arguments"]["json"] == {"effect": 2}
    assert details["replayed"]["arguments"]["json"] == {"effect": 3}
    assert bodies(sink) == [{"effect": 1}, {"effect": 2}]  # 0 sends


def test_replay_runs_prints_how_many_ended_the_same_diverged_or_failed(cluster, load_agent, submit, sink):
    """Two runs under a version whose step 2 sends effect 2, two under one that sends effect 3; replayed against
    the second: two the same, two diverged at step 2. Then a replay that cannot end the same (its version asks
    for another tool at step 1) fails the check: exit 1."""
    import subprocess
    import sys

    from runs.services.run_list import short_id
    from tests.conftest import ROOT, subprocess_env

    first = load_agent(name="payer", turns=[post(sink, 1), post(sink, 2), {"text": "paid"}], tools=("http_post",))
    c = cluster(AGENTRT_LEASE_SECONDS=3, AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host)
    old = [submit(agent="payer", text=f"old {i}") for i in range(2)]
    second = load_agent(name="payer", turns=[post(sink, 1), post(sink, 3), {"text": "paid"}], tools=("http_post",))
    new = [submit(agent="payer", text=f"new {i}") for i in range(2)]
    for run in old + new:
        wait_for(settled(run.id, "COMPLETED", "FAILED"), timeout=90, message=f"the originals to end\n{c.output()}")
    sends = sink.count()
    assert sends == 8 and first.version != second.version

    done = subprocess.run(
        [sys.executable, "manage.py", "replay_runs", "--agent", "payer", "--version", second.version,
         "--since", "1h", "--tenant", "acme", "--concurrency", "2", "--timeout", "90"],
        cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 1, (done.returncode, out, done.stderr)
    lines = out.strip().splitlines()
    assert lines, done.stderr
    assert lines[0].split() == ["run", "replay", "original", "replay", "verdict"]
    verdicts = {line.split()[0]: line.split(maxsplit=4)[4] for line in lines[1:-1]}
    assert len(lines) == 6 and len(verdicts) == 4, out  # one line a run, each named by its short id
    assert verdicts == {
        **{short_id(r.id): "diverged at step 2 (different_call)" for r in old},
        **{short_id(r.id): "same" for r in new},
    }, out
    assert lines[-1] == (
        f"4 runs of payer replayed against version {second.version[:10]}: 2 the same, 2 diverged (step 2: 2), 0 failed"
    )
    assert sink.count() == sends  # replays send nothing
    replays = Run.objects.filter(replay_of__in=[r.id for r in old + new])
    assert replays.count() == 4 and all(r.agent_version == second.version for r in replays)
