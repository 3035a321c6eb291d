"""Real `qcluster` workers killed, stopped and cancelled at the fault points
of DESIGN §16, with a real `run_maintenance` process reclaiming their runs
and an HTTP sink counting every side effect (RELIABILITY §3, DESIGN's names).

Every fault point the in-process simulations use
(tests/integration/test_resume_simulated_crash.py and
test_reconcile_simulated_crash.py, where a BaseException stands in for the
death and `finally` blocks still run) is also exercised here with a real
SIGKILL, where nothing of the dying process runs: model.after_call,
tool.before_watermark, tool.after_watermark, tool.after_execute,
checkpoint.before_write, resume.after_takeover (the resumer itself dies), and
the reconcile paths with AGENTRT_RECONCILER naming a reconciler of
tests/integration/reconcilers.py in the maintenance process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from django.db import connection

from approvals.models import Approval
from approvals.services import approval_decide
from runs.models import Event, ModelCall, Run, ToolInvocation
from runs.services.lifecycle import run_cancel
from tests.conftest import ROOT, subprocess_env, wait_for
from tests.procfs import stat

pytestmark = [pytest.mark.fault, pytest.mark.django_db(transaction=True)]

LEASE = 2.0
ARTIFACTS = ROOT / "artifacts"


@pytest.fixture
def stack(cluster, sink, tmp_path):
    """Start a cluster and a maintenance process with one fault plan."""
    procs = []
    envs = []

    def maintenance():
        """Start (another) `run_maintenance` with the plan of `start`."""
        log = open(tmp_path / f"maintenance-{len(procs)}.log", "wb")
        m = subprocess.Popen(
            [sys.executable, "manage.py", "run_maintenance"],
            cwd=ROOT,
            env=subprocess_env(**envs[-1]),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        procs.append((m, log))
        return m

    def start(faults: str = "", workers: int = 2, reconciler: str = "", **extra):
        env = dict(
            AGENTRT_LEASE_SECONDS=LEASE,
            AGENTRT_WORKERS=workers,
            AGENTRT_ENABLE_FAULTPOINTS=1,
            AGENTRT_FAULTPOINTS=faults,
            AGENTRT_FAULTPOINT_DIR=tmp_path,
            AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host,
            **extra,
        )
        if reconciler:
            env["AGENTRT_RECONCILER"] = "tests.integration.reconcilers." + reconciler
        envs.append(env)
        c = cluster(**env)
        maintenance()
        return c

    start.maintenance = maintenance
    start.procs = procs
    yield start
    for m, log in procs:
        m.terminate()
        try:
            m.wait(timeout=10)
        except subprocess.TimeoutExpired:
            m.kill()
        log.close()


def post_agent(load_agent, sink, before=1):
    turns = [{"tool_calls": [{"name": "echo", "arguments": {"text": f"look {i}"}}]} for i in range(before)]
    turns += [
        {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": 5}}}]},
        {"text": "paid"},
    ]
    load_agent(turns=turns, tools=("echo", "http_post"))


def status(run):
    return Run.objects.filter(id=run.id).values_list("status", flat=True).get()


def park_or_end(run):
    """Await the run leaving QUEUED/RUNNING; it must have parked (a run that
    completed or failed instead fails here at once, not after a timeout)."""
    wait_for(lambda: status(run) not in ("QUEUED", "RUNNING"), timeout=90, message="the run to park")
    row = Run.objects.get(id=run.id)
    assert row.status == "WAITING_FOR_APPROVAL", (row.status, row.failure)


def marker(tmp_path, point, run):
    return tmp_path / f"{point}.{run.id}"


def record_takeover(run, point, tmp_path):
    """Kill → the new owner's first write (lease.taken_over), for the note."""
    killed = datetime.fromtimestamp(marker(tmp_path, point, run).stat().st_mtime, tz=UTC)
    taken = Event.objects.filter(run=run, type="lease.taken_over").order_by("sequence").first()
    latency = (taken.occurred_at - killed).total_seconds()
    ARTIFACTS.mkdir(exist_ok=True)
    with open(ARTIFACTS / "takeover_latency.jsonl", "a") as fh:
        fh.write(
            json.dumps({"point": point, "lease": LEASE, "sweep_interval": LEASE / 6, "latency_s": round(latency, 3)})
            + "\n"
        )
    return latency


@pytest.mark.parametrize(
    "point",
    [
        "model.before_call",
        "model.after_call",
        "tool.before_watermark",
        "checkpoint.before_write",
        "finalize.before_transition",
    ],
)
def test_sigkill_before_any_unknown_effect_completes_with_one_send(stack, load_agent, submit, sink, tmp_path, point):
    post_agent(load_agent, sink)
    c = stack(f"{point}=kill")
    run = submit()
    wait_for(
        lambda: status(run) == "COMPLETED",
        timeout=90,
        message=f"completion after a kill at {point}\n{c.output()[-3000:]}",
    )
    assert marker(tmp_path, point, run).exists()
    assert sink.count() == 1
    row = Run.objects.get(id=run.id)
    assert row.final_message == "paid" and row.lease_epoch >= 2
    assert Event.objects.filter(run=run, type="lease.taken_over").exists()
    assert row.step_count == ModelCall.objects.filter(run=run).values("step_number").distinct().count()
    record_takeover(run, point, tmp_path)


def test_sigkill_after_the_watermark_parks_the_run_and_approval_sends_once(
    stack, load_agent, submit, sink, tmp_path, operator
):
    post_agent(load_agent, sink)
    stack("tool.after_watermark=kill")
    run = submit()
    park_or_end(run)
    assert sink.count() == 0
    row = Run.objects.get(id=run.id)
    assert row.lease_owner is None
    record_takeover(run, "tool.after_watermark", tmp_path)
    approval = Approval.objects.get(run=run, status="pending")
    assert approval.kind == "interrupted_side_effect"
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash, via="api")
    wait_for(lambda: status(run) == "COMPLETED", timeout=60, message="completion after approval")
    inv = ToolInvocation.objects.get(run=run, tool_name="http_post")
    assert sink.count() == 1 and sink.sends[0]["key"] == inv.idempotency_key and sink.sends[0]["attempt"] == "2"


def test_the_watermark_commits_strictly_before_the_send_a_sigkill_between_them_sent_nothing(
    stack, load_agent, submit, sink, tmp_path
):
    """A real SIGKILL of the qcluster worker at `tool.after_watermark`, after
    the watermark's transaction committed and before the request is made:
    when the worker is dead the sink has received nothing, and the watermark
    is in the database (`effect_sent_at`); the takeover then finds the call
    executing and marks it interrupted, and nothing is sent while the run
    waits for an operator. With the send ahead of the watermark
    (tests/mutants/send_before_the_watermark.toml) the sink already holds
    the request when the worker dies."""
    post_agent(load_agent, sink, before=0)
    stack("tool.after_watermark=kill")
    run = submit()
    fired = marker(tmp_path, "tool.after_watermark", run)
    wait_for(fired.exists, timeout=60, message="the worker to reach the point after the watermark")
    wait_for(lambda: fired.read_text().strip(), timeout=10, message="the marker to name its worker")
    worker = int(fired.read_text())
    wait_for(
        lambda: (s := stat(worker)) is None or s[0] == "Z", timeout=30, message=f"worker {worker} to die of SIGKILL"
    )
    assert sink.count() == 0, sink.sends  # nothing left before the kill
    inv = ToolInvocation.objects.get(run=run, tool_name="http_post")
    assert inv.effect_sent_at is not None and inv.attempt == 1  # the watermark committed before it
    park_or_end(run)
    inv = ToolInvocation.objects.get(id=inv.id)
    assert inv.status == "interrupted" and inv.effect_sent_at is not None and inv.attempt == 1
    assert Approval.objects.get(run=run, status="pending").kind == "interrupted_side_effect"
    assert sink.count() == 0


def test_sigkill_after_the_call_parks_the_run_and_rejection_sends_nothing_more(
    stack, load_agent, submit, sink, tmp_path, operator
):
    post_agent(load_agent, sink)
    stack("tool.after_execute=kill")
    run = submit()
    park_or_end(run)
    assert sink.count() == 1
    approval = Approval.objects.get(run=run, status="pending")
    approval_decide(
        user=operator, approval_id=approval.id, approve=False, request_hash=approval.request_hash, via="api"
    )
    assert status(run) == "FAILED"
    assert Run.objects.get(id=run.id).failure["reason"] == "operator_rejected"
    assert sink.count() == 1


def test_sigkill_of_the_resumer_after_its_takeover_leaves_the_unknown_outcome_for_the_next(
    stack, load_agent, submit, sink, tmp_path, operator
):
    """The worker dies after the watermark; the process that resumes it (the
    maintenance sweep, or a worker's drive_run) is itself SIGKILLed right
    after its takeover. The next resumer still finds the outcome unknown and
    parks the run; nothing is sent until an operator approves."""
    post_agent(load_agent, sink)
    stack("tool.after_watermark=kill,resume.after_takeover=kill")
    first = stack.procs[0][0]
    run = submit()
    restarted = []

    def parked():
        if first.poll() is not None and not restarted:  # the resumer that died was the maintenance process
            restarted.append(stack.maintenance())
        return status(run) == "WAITING_FOR_APPROVAL"

    wait_for(parked, timeout=90, message="a second resumer to park the run")
    assert marker(tmp_path, "resume.after_takeover", run).exists()
    assert sink.count() == 0
    assert Event.objects.filter(run=run, type="lease.taken_over").count() >= 2
    inv = ToolInvocation.objects.get(run=run, tool_name="http_post")
    assert inv.status == "interrupted" and inv.effect_sent_at is not None and inv.attempt == 1
    approval = Approval.objects.get(run=run, status="pending")
    assert approval.kind == "interrupted_side_effect"
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash, via="api")
    wait_for(lambda: status(run) == "COMPLETED", timeout=60, message="completion after approval")
    assert sink.count() == 1 and sink.sends[0]["attempt"] == "2"


# The reconcile paths, with a real reconciler in the real resumer (the
# in-process twins are in tests/integration/test_reconcile_simulated_crash.py).
RECONCILED = [
    pytest.param("tool.after_watermark", "always_continue", "COMPLETED", None, 0, id="after_watermark-continue"),
    pytest.param("tool.after_execute", "always_continue", "COMPLETED", None, 1, id="after_execute-continue"),
    pytest.param("model.after_call", "always_continue", "COMPLETED", None, 1, id="after_call-continue"),
    pytest.param("tool.after_execute", "completed_json", "COMPLETED", None, 1, id="after_execute-completed"),
    pytest.param(
        "tool.after_execute", "conflict_with_detail", "FAILED", "reconcile_conflict", 1, id="after_execute-conflict"
    ),
]


def pay_agent(load_agent, sink):
    load_agent(
        turns=[
            {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": 5}}}]},
            {"text": "paid"},
        ],
        tools=("http_post",),
    )


@pytest.mark.parametrize("point,name,end,reason,sent", RECONCILED)
def test_sigkill_then_the_reconciler_decides_and_nothing_is_sent_twice(
    stack, load_agent, submit, sink, tmp_path, point, name, end, reason, sent
):
    from tests.integration import reconcilers as R

    pay_agent(load_agent, sink)
    c = stack(f"{point}=kill", reconciler=name)
    run = submit()
    wait_for(
        lambda: status(run) in ("COMPLETED", "FAILED", "CANCELLED", "WAITING_FOR_APPROVAL"),
        timeout=90,
        message=f"the run to end after a kill at {point} and {name}\n{c.output()[-3000:]}",
    )
    assert marker(tmp_path, point, run).exists()
    row = Run.objects.get(id=run.id)
    assert row.status == end, (row.status, row.failure)
    assert row.lease_owner is None and row.lease_epoch >= 2
    assert Event.objects.filter(run=run, type="lease.taken_over").exists()
    assert not Approval.objects.filter(run=run).exists()
    assert sink.count() == sent
    if reason:
        assert row.failure["reason"] == reason and R.DETAIL in row.failure["message"]
    elif name == "completed_json":
        assert row.result == R.RESULT
    else:
        assert row.final_message == "paid"
    if point != "model.after_call":
        inv = ToolInvocation.objects.get(run=run)
        assert inv.attempt == 1 and inv.effect_sent_at is not None  # the interrupted call was never re-run


def test_sigkill_after_the_watermark_then_a_waiting_reconciler_parks_and_approval_sends_once(
    stack, load_agent, submit, sink, tmp_path, operator
):
    from tests.integration import reconcilers as R

    pay_agent(load_agent, sink)
    stack("tool.after_watermark=kill", reconciler="waiting")
    run = submit()
    park_or_end(run)
    assert sink.count() == 0
    approval = Approval.objects.get(run=run, status="pending")
    # The reconciler's presentation, plus what runs.
    assert approval.kind == "reconcile" and approval.presentation == {
        **R.PAUSE["presentation"],
        "tool": "http_post",
        "arguments": {"url": sink.url, "json": {"amount": 5}},
        "side_effect": "external_write",
    }
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash, via="api")
    wait_for(lambda: status(run) == "COMPLETED", timeout=60, message="completion after approval")
    inv = ToolInvocation.objects.get(run=run)
    assert inv.attempt == 2 and sink.count() == 1
    assert sink.sends[0]["key"] == inv.idempotency_key and sink.sends[0]["attempt"] == "2"


def test_a_sigstopped_zombie_writes_only_run_fenced_and_the_effect_is_sent_once(
    stack, load_agent, submit, sink, tmp_path
):
    post_agent(load_agent, sink)
    stack("tool.before_watermark=stop")
    run = submit()
    stop_marker = marker(tmp_path, "tool.before_watermark", run)
    wait_for(stop_marker.exists, timeout=60, message="the worker to stop itself")
    zombie_pid = int(stop_marker.read_text())
    wait_for(lambda: status(run) == "COMPLETED", timeout=90, message="another worker to take over and finish")
    old_epoch = (
        Event.objects.filter(run=run, type="lease.taken_over").order_by("sequence").first().payload["previous_epoch"]
    )

    def zombie_rows():
        with connection.cursor() as cur:
            counts = {}
            for table in ("model_calls", "tool_invocations", "checkpoints"):
                cur.execute(f"SELECT count(*) FROM {table} WHERE run_id = %s AND lease_epoch = %s", [run.id, old_epoch])
                counts[table] = cur.fetchone()[0]
            return counts

    before_rows = zombie_rows()
    before_events = list(Event.objects.filter(run=run).values_list("sequence", flat=True))
    before_run = Run.objects.filter(id=run.id).values().get()
    os.kill(zombie_pid, signal.SIGCONT)
    wait_for(
        lambda: Event.objects.filter(run=run, type="run.fenced").exists(),
        timeout=30,
        message="the zombie to record run.fenced",
    )
    new_events = list(Event.objects.filter(run=run).exclude(sequence__in=before_events))
    assert [e.type for e in new_events] == ["run.fenced"]
    assert new_events[0].lease_epoch == old_epoch
    assert zombie_rows() == before_rows
    assert Run.objects.filter(id=run.id).values().get() == before_run
    assert sink.count() == 1


def _await_heartbeat_after_cancel(run):
    seen = Run.objects.get(id=run.id).lease_expires_at
    wait_for(
        lambda: Run.objects.get(id=run.id).lease_expires_at != seen,
        timeout=10,
        message="a heartbeat to read the cancel",
    )


def test_cancel_before_the_watermark_stops_cleanly(stack, load_agent, submit, sink, tmp_path):
    post_agent(load_agent, sink, before=0)
    stack("tool.before_watermark=pause")
    run = submit()
    wait_for(lambda: (tmp_path / f"tool.before_watermark.{run.id}.paused").exists(), timeout=60, message="the pause")
    run_cancel(run=Run.objects.get(id=run.id))
    _await_heartbeat_after_cancel(run)
    (tmp_path / f"tool.before_watermark.{run.id}.go").touch()
    wait_for(lambda: status(run) == "CANCELLED", timeout=30, message="cancellation")
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "cancelled" and inv.effect_sent_at is None
    assert Event.objects.filter(run=run, type="tool.run_cancelled").count() == 1
    assert sink.count() == 0


def test_cancel_after_the_watermark_does_not_stop_the_send_and_its_result_is_kept(
    stack, load_agent, submit, sink, tmp_path
):
    post_agent(load_agent, sink, before=0)
    stack("tool.after_watermark=pause")
    run = submit()
    wait_for(lambda: (tmp_path / f"tool.after_watermark.{run.id}.paused").exists(), timeout=60, message="the pause")
    run_cancel(run=Run.objects.get(id=run.id))
    _await_heartbeat_after_cancel(run)
    (tmp_path / f"tool.after_watermark.{run.id}.go").touch()
    wait_for(lambda: status(run) == "CANCELLED", timeout=30, message="cancellation")
    inv = ToolInvocation.objects.get(run=run)
    # The call was started (watermark) when the cancel was seen: it is not abandoned (a cancel observed after
    # effect_sent_at lets the call run to completion), it was sent once and its answer is the record.
    assert inv.status == "completed" and inv.outcome == "succeeded" and inv.effect_sent_at is not None
    assert inv.result["status"] == 200
    assert sink.count() == 1
