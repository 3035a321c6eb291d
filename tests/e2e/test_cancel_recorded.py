"""A cancel is recorded the moment it is accepted and reaches the worker at
once (issue 38 item 1), through a real qcluster, the REST endpoint and the
command line.

- A running run inside a long model call: `POST /api/runs/{id}/cancel/`
  (or `manage.py runs cancel --reason`, a process of its own) answers
  202 with `run.cancel_requested` (who, via, the scrubbed reason) already
  written; the worker, whose heartbeat is 40 s away, hears the
  cancel doorbell (its first notification, logged once) and stops at the
  next observation point: the model call waiting on the token returns, no
  further model call starts, and `run.cancelled` repeats who and why.
- A run already past its last observation point (paused in finalize, its
  outcome computed) ends COMPLETED, and the record says the cancel came too
  late: `run.cancel_requested`, then `run.completed`, then
  `run.cancel_too_late` naming the request.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from runs.models import Event, ModelCall, Run
from tests.conftest import ROOT, subprocess_env, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ECHO = {"name": "echo", "arguments": {"text": "a"}}
# A secret in the reason is scrubbed like any text a person hands the runtime.
REASON = "wrong input; the key sk-live-4f9a8b7c6d5e4f3a2b1c0d9e was pasted by mistake"


def events(run) -> list[tuple[int, str, dict]]:
    return list(Event.objects.filter(run_id=run.id).order_by("sequence").values_list("sequence", "type", "payload"))


def types(run) -> list[str]:
    return [t for _, t, _ in events(run)]


def status(run) -> str:
    return Run.objects.filter(id=run.id).values_list("status", flat=True).get()


@pytest.fixture
def api(tenant):
    client = APIClient()
    client.force_authenticate(get_user_model().objects.get(username="alice"))
    return client


def model_call_started(run, step: int) -> bool:
    return Event.objects.filter(run_id=run.id, type="model.request.started", payload__step=step).exists()


def cancel_by_cli(run, reason: str) -> dict:
    """`manage.py runs cancel` as a process of its own: its transaction rings the doorbell the worker hears."""
    done = subprocess.run(
        [sys.executable, "manage.py", "runs", "cancel", str(run.id), "--as", "alice", "--reason", reason, "--json"],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("via", ["api", "cli"])
def test_a_cancel_is_recorded_at_once_and_the_worker_stops_at_the_next_observation_point(
    cluster, load_agent, submit, api, via
):
    load_agent(
        turns=[
            {"tool_calls": [ECHO]},
            {"tool_calls": [ECHO], "delay_ms": 30_000},  # a slow model: it waits on the run's token
            {"tool_calls": [ECHO]},
            {"text": "never"},
        ]
    )
    # Heartbeats every 40 s: only the cancel doorbell can tell the worker before the slow call ends on its own.
    c = cluster(AGENTRT_LEASE_SECONDS=120, AGENTRT_LOG_LEVEL="INFO")
    run = submit()
    wait_for(lambda: model_call_started(run, 2), timeout=60, message=f"step 2's model call\n{c.output()[-3000:]}")

    if via == "api":
        answer = api.post(f"/api/runs/{run.id}/cancel/", {"reason": REASON}, format="json")
        assert answer.status_code == 202, answer.content
        body = answer.json()
    else:
        body = cancel_by_cli(run, REASON)
    assert body["status"] == "RUNNING" and body["cancel_requested_at"] is not None
    # The request is an event before the answer: who, via which surface, why (scrubbed).
    (request,) = [p for _, t, p in events(run) if t == "run.cancel_requested"]
    assert request["by"] == "alice" and request["via"] == via
    assert request["reason"].startswith("wrong input") and "sk-live-4f9a8b7c6d5e4f3a2b1c0d9e" not in request["reason"]

    wait_for(lambda: status(run) == "CANCELLED", timeout=25, message=f"the cancel\n{c.output()[-3000:]}")
    seq = {t: s for s, t, _ in reversed(events(run))}  # each type's first sequence
    record = events(run)
    requested_at = seq["run.cancel_requested"]
    assert requested_at < seq["run.cancelled"]
    # No model call started after the request: step 2's call was cut short at the token, step 3 never asked.
    assert [s for s, t, _ in record if t == "model.request.started" and s > requested_at] == []
    assert not model_call_started(run, 3)
    assert not [t for s, t, _ in record if s > requested_at and t.startswith("tool.call.")]
    cancelled = next(p for _, t, p in record if t == "run.cancelled")
    assert (cancelled["by"], cancelled["via"], cancelled["reason"]) == ("alice", via, request["reason"])
    assert ModelCall.objects.filter(run_id=run.id, step_number=2).count() == 1  # one attempt, never retried
    # The worker heard it from the doorbell, the first notification (not a heartbeat, not a re-read at LISTEN).
    log = c.output()
    assert log.count(f"run {run.id}: cancel requested (doorbell)") == 1, log[-3000:]
    assert "cancel requested (read at LISTEN)" not in log and "cancel doorbell:" not in log


def test_a_cancel_after_the_last_observation_point_leaves_the_run_completed_and_says_so(
    cluster, load_agent, submit, api, tmp_path
):
    load_agent(turns=[{"tool_calls": [ECHO]}, {"text": "done"}])
    c = cluster(
        AGENTRT_ENABLE_FAULTPOINTS=1,
        AGENTRT_FAULTPOINTS="finalize.before_transition=pause",  # the outcome is computed, not yet committed
        AGENTRT_FAULTPOINT_DIR=tmp_path,
    )
    run = submit()
    paused = tmp_path / f"finalize.before_transition.{run.id}.paused"
    wait_for(paused.exists, timeout=60, message=f"the pause in finalize\n{c.output()[-3000:]}")

    answer = api.post(f"/api/runs/{run.id}/cancel/", {}, format="json")
    assert answer.status_code == 202 and answer.json()["status"] == "RUNNING"
    (tmp_path / f"finalize.before_transition.{run.id}.go").touch()

    wait_for(lambda: "run.cancel_too_late" in types(run), timeout=30, message=f"the end\n{c.output()[-3000:]}")
    row = Run.objects.get(id=run.id)
    assert row.status == "COMPLETED" and row.final_message == "done" and row.cancel_requested_at is not None
    record = events(run)
    order = [t for _, t, _ in record if t in ("run.cancel_requested", "run.completed", "run.cancel_too_late")]
    assert order == ["run.cancel_requested", "run.completed", "run.cancel_too_late"]
    late = next(p for _, t, p in record if t == "run.cancel_too_late")
    assert late["status"] == "COMPLETED" and (late["by"], late["via"], late["reason"]) == ("alice", "api", None)
    assert late["requested_at"] and "run.cancelled" not in types(run)
    # The run had ended: a second request is refused and records nothing.
    again = api.post(f"/api/runs/{run.id}/cancel/", {"reason": "again"}, format="json")
    assert again.status_code == 409 and again.json()["code"] == "run_terminal"
    assert types(run).count("run.cancel_requested") == 1
