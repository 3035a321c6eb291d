"""Kill anything, anytime (issue 14, item 1): every process of a worker node
may be SIGKILLed at any moment and the deployment recovers with no person.

Real `qcluster` processes; the roles are told apart by their kernel names
(runs/qheal.py names them qc-sentinel, qc-worker, qc-pusher, qc-monitor).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from runs.models import Run
from tests.conftest import ROOT, subprocess_env, wait_for

pytestmark = [pytest.mark.fault, pytest.mark.django_db(transaction=True)]

LEASE = 3
# Queued runs are claimed again within lease + 10 s; the waits below add
# room for a loaded 2-core machine, they are not the bound being checked.
BOUND = LEASE + 10 + 30


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return found


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def roles(main_pid: int) -> dict[str, list[int]]:
    """{role: [pids]} of the live processes under a qcluster main process."""
    out: dict[str, list[int]] = {}
    for sentinel in children(main_pid):
        out.setdefault(comm(sentinel), []).append(sentinel)
        for pid in children(sentinel):
            out.setdefault(comm(pid), []).append(pid)
    return out


def node_ready(c, workers: int):
    r = roles(c.proc.pid)
    ok = len(r.get("qc-sentinel", [])) == 1 and len(r.get("qc-worker", [])) >= workers and r.get("qc-pusher") and r.get("qc-monitor")
    return r if ok else None


def status(run_id):
    return Run.objects.filter(id=run_id).values_list("status", flat=True).get()


def all_completed(runs):
    return all(status(r.id) == "COMPLETED" for r in runs)


def test_idle_workers_sigkilled_then_new_runs_complete_without_a_restart(cluster, load_agent, submit):
    """The known wedge: an idle worker waits in task_queue.get() holding the
    queue's reader lock; SIGKILLed there it never releases it."""
    load_agent(turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}]}, {"text": "bye"}])
    c = cluster(AGENTRT_LEASE_SECONDS=LEASE, AGENTRT_WORKERS=2)
    warm = submit(text="warm")
    wait_for(lambda: status(warm.id) == "COMPLETED", timeout=60, message=f"the warm-up run\n{c.output()[-3000:]}")
    before = wait_for(lambda: node_ready(c, 2), timeout=30, message="the node's processes")
    for pid in before["qc-worker"]:  # every worker is idle: nothing is running
        os.kill(pid, signal.SIGKILL)
    runs = [submit(text=f"after {i}") for i in range(4)]
    wait_for(lambda: all_completed(runs), timeout=BOUND,
             message=f"runs submitted after the idle workers died to complete\n{c.output()[-3000:]}")
    assert c.proc.poll() is None  # healed in place: nobody restarted the node
    after = roles(c.proc.pid)
    assert not set(after["qc-worker"]) & set(before["qc-worker"])
