"""Kill anything, anytime (issue 14, item 1): every process of a worker node
may be SIGKILLed at any moment and the deployment recovers with no person.

Real `qcluster` processes; the roles are told apart by their kernel names
(runs/runtime/qheal.py names them qc-sentinel, qc-worker, qc-pusher, qc-monitor).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.db import connection

from runs.models import Event, Run
from tests.conftest import ROOT, free_port, subprocess_env, wait_for
from tests.procfs import children, comm, in_sessions

pytestmark = [pytest.mark.fault, pytest.mark.django_db(transaction=True)]

LEASE = 3
APP = "agentrt-fault-deployment"  # application_name of the deployment's connections
# Queued runs are claimed again within lease + 10 s; the waits below add
# room for a loaded 2-core machine, they are not the bound being checked.
BOUND = LEASE + 10 + 30


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
    ok = (
        len(r.get("qc-sentinel", [])) == 1
        and len(r.get("qc-worker", [])) >= workers
        and r.get("qc-pusher")
        and r.get("qc-monitor")
    )
    return r if ok else None


def wait_or_dump(condition, timeout, message, *nodes):
    """wait_for, with the nodes' logs in the failure message."""
    try:
        return wait_for(condition, timeout=timeout, message=message)
    except AssertionError as exc:
        logs = "\n".join(n.output()[-4000:] for n in nodes)
        raise AssertionError(f"{exc}\n--- node logs ---\n{logs}") from None


def status(run_id):
    return Run.objects.filter(id=run_id).values_list("status", flat=True).get()


def more_events_than(count):
    """A condition for wait_or_dump: the event log grew beyond `count` rows."""
    return lambda: Event.objects.count() > count


def all_completed(runs):
    return all(status(r.id) == "COMPLETED" for r in runs)


class Supervised:
    """A process under a minimal supervisor, as systemd's Restart=on-failure:
    started in its own session, started again whenever it exits non-zero."""

    def __init__(self, name: str, args: list[str], env: dict, log_path: Path):
        self.name, self.args, self.env, self.log_path = name, args, env, log_path
        self.exits: list[int] = []
        self.generations: list[subprocess.Popen] = []
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._start()
        self._thread = threading.Thread(target=self._watch, name=f"supervise-{name}", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, *self.args],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.generations.append(self.proc)

    def _watch(self) -> None:
        while True:
            rc = self.proc.wait()
            with self._lock:
                if self._stopping.is_set():
                    return
                self.exits.append(rc)
                if rc == 0:
                    return  # a clean exit is a decision, not a failure
                self._start()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        with self._lock:
            self._stopping.set()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        for p in self.generations:  # whatever a generation left behind
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            p.wait()


@pytest.fixture
def deployment(transactional_db, tmp_path):
    """One worker node and maintenance on the test database, each under a supervisor."""
    started: list[Supervised] = []

    def start(workers: int = 2, **extra):
        env = subprocess_env(AGENTRT_LEASE_SECONDS=LEASE, AGENTRT_WORKERS=workers, PGAPPNAME=APP, **extra)
        node = Supervised("qcluster", ["manage.py", "qcluster"], env, tmp_path / "qcluster.log")
        started.append(node)
        maintenance = Supervised("maintenance", ["manage.py", "run_maintenance"], env, tmp_path / "maintenance.log")
        started.append(maintenance)
        return node, maintenance

    yield start
    for s in reversed(started):
        s.stop()


def slow_agent(load_agent, steps: int = 4, delay_ms: int = 300):
    turns = [
        {"tool_calls": [{"name": "echo", "arguments": {"text": str(i)}}], "delay_ms": delay_ms} for i in range(steps)
    ]
    load_agent(turns=turns + [{"text": "done"}], limits={"max_steps": steps + 4})


def busy_worker_pid(run_id) -> int | None:
    owner = Run.objects.filter(id=run_id).values_list("lease_owner", flat=True).get()
    return int(owner.split(":")[1]) if owner else None


def test_idle_workers_sigkilled_then_new_runs_complete_without_a_restart(deployment, load_agent, submit):
    """The known wedge: an idle worker waits in task_queue.get() holding the
    queue's reader lock; SIGKILLed there it never releases it."""
    load_agent(turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}]}, {"text": "bye"}])
    node, _ = deployment(workers=2)
    warm = submit(text="warm")
    wait_or_dump(lambda: status(warm.id) == "COMPLETED", 60, "the warm-up run", node)
    before = wait_for(lambda: node_ready(node, 2), timeout=30, message="the node's processes")
    for pid in before["qc-worker"]:  # every worker is idle: nothing is running
        os.kill(pid, signal.SIGKILL)
    runs = [submit(text=f"after {i}") for i in range(4)]
    wait_or_dump(lambda: all_completed(runs), BOUND, "runs submitted after the idle workers died to complete", node)
    assert node.exits == [] and node.proc.poll() is None  # healed in place: nobody restarted the node
    after = roles(node.proc.pid)
    assert not set(after["qc-worker"]) & set(before["qc-worker"])
    # the node's log names the workers it respawned (at WARNING and above: the
    # chaos checker ties a short-lived worker to its node by this line)
    from tests.chaos.soak import parse_worker_pids

    named = parse_worker_pids(node.log_path.read_text(errors="replace").splitlines())
    assert set(after["qc-worker"]) <= set(named), (after, named)
    record_claim_delays("idle-workers", runs)


# role killed -> does the node heal in place, or exit non-zero for its supervisor?
KILLS = {
    "busy-worker": "heals",
    "pusher": "heals",
    "monitor": "heals",
    "sentinel": "exits",
    "main": "exits",
}


@pytest.mark.parametrize("victim", list(KILLS))
def test_sigkill_of_any_cluster_process_under_load_and_every_run_completes(victim, deployment, load_agent, submit):
    slow_agent(load_agent)
    node, _ = deployment(workers=2)
    first = [submit(text=f"before {i}") for i in range(4)]
    running = wait_or_dump(
        lambda: next((r for r in first if status(r.id) == "RUNNING"), None), 60, "a run to be claimed", node
    )
    r = wait_for(lambda: node_ready(node, 2), timeout=30, message="the node's processes")
    main = node.proc
    old_children = [p for role, pids in r.items() if role != "qc-sentinel" for p in pids]
    if victim == "busy-worker":
        pid = wait_for(lambda: busy_worker_pid(running.id), timeout=30, message="the busy worker")
    elif victim == "main":
        pid = main.pid
    else:
        pid = r[f"qc-{victim}"][0]
    os.kill(pid, signal.SIGKILL)
    later = [submit(text=f"after {i}") for i in range(4)]
    wait_or_dump(
        lambda: all_completed(first + later), BOUND + 30, f"every run to complete after the {victim} was killed", node
    )
    if KILLS[victim] == "heals":
        assert node.exits == [] and node.proc is main, "the node healed in place"
    else:
        assert node.exits and node.exits[0] != 0 and node.proc is not main, "the node exited non-zero and was restarted"
        # Nothing of the killed generation lives on: orphans drain and exit.
        wait_or_dump(lambda: not in_sessions({main.pid}), 60, "the old generation's processes to exit", node)
    # The pusher, monitor and workers of the broken queues are all replaced.
    wait_or_dump(
        lambda: not set(old_children) & set(in_sessions({main.pid})), 30, "the old queues' processes to be gone", node
    )
    if victim == "busy-worker":
        assert Event.objects.filter(run=running, type="lease.taken_over").exists()
    record_claim_delays(victim, later)


def record_claim_delays(case: str, runs) -> None:
    """Figures for the notes, not assertions: submit -> first claim of runs
    submitted right after a kill (the bound is lease + 10 s)."""
    import json

    delays = []
    for run in runs:
        created = Run.objects.filter(id=run.id).values_list("created_at", flat=True).get()
        claimed = (
            Event.objects.filter(run=run, type="run.claimed")
            .order_by("sequence")
            .values_list("occurred_at", flat=True)
            .first()
        )
        delays.append(round((claimed - created).total_seconds(), 2))
    (ROOT / "artifacts").mkdir(exist_ok=True)
    path = ROOT / "artifacts" / "kill_claim_delays.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[case] = {"lease_s": LEASE, "claim_delays_s": delays}
    path.write_text(json.dumps(data, indent=1, sort_keys=True))


def terminate_backends(where: str = "TRUE") -> int:
    """pg_terminate_backend of the deployment's backends: its processes connect
    as application_name APP (libpq's PGAPPNAME); never a connection of this
    test process (any of its threads), never another database's."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            f"WHERE datname = current_database() AND application_name = %s AND pid <> pg_backend_pid() AND ({where})",
            [APP],
        )
        return cursor.fetchone()[0]


def deployment_backends() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = %s AND pid <> pg_backend_pid()",
            [APP],
        )
        return cursor.fetchone()[0]


def test_every_backend_terminated_mid_step_and_every_run_completes(deployment, load_agent, submit):
    """What a PostgreSQL restart does to our processes: every connection of
    workers, heartbeats, pusher and doorbell listener, monitor, sentinel and
    maintenance is cut, twice, while runs are mid-step."""
    slow_agent(load_agent, steps=5, delay_ms=400)
    node, maintenance = deployment(workers=2, AGENTRT_TENANT_MAX_RUNNING=2)  # one tenant on both workers
    runs = [submit(text=f"run {i}") for i in range(6)]
    wait_or_dump(lambda: sum(status(r.id) == "RUNNING" for r in runs) >= 2, 60, "two runs mid-step", node)
    for round_ in range(2):
        progressed = more_events_than(Event.objects.count() + 3)
        # After the first cut each process reconnects at its own next query:
        # cut again once at least the two workers and the listener are back.
        wait_for(lambda: deployment_backends() >= 3, timeout=BOUND, message="three backends to cut")
        assert terminate_backends() >= 3  # at least the two workers and the listener
        wait_or_dump(progressed, BOUND, f"progress after cut {round_ + 1}", node, maintenance)
    wait_or_dump(lambda: all_completed(runs), BOUND + 30, "every run to complete", node, maintenance)
    assert maintenance.exits == [] and node.exits == []  # both reconnected in place


def test_the_doorbell_listener_terminated_then_a_new_run_starts(deployment, load_agent, submit):
    load_agent()
    node, _ = deployment(workers=1, AGENTRT_Q_FALLBACK_POLL=30)  # the fallback poll cannot be what finds it
    warm = submit(text="warm")
    wait_or_dump(lambda: status(warm.id) == "COMPLETED", 60, "the warm-up run", node)
    wait_for(lambda: terminate_backends("query ILIKE 'LISTEN%%'"), timeout=30, message="the listener's backend")
    run = submit(text="after")
    wait_or_dump(lambda: status(run.id) == "COMPLETED", BOUND, "a run submitted after the listener was cut", node)
    assert node.exits == []


def test_run_maintenance_sigkilled_is_restarted_and_reclaims_a_dead_workers_run(deployment, load_agent, submit):
    slow_agent(load_agent, steps=6, delay_ms=400)
    node, maintenance = deployment(workers=1)
    run = submit()
    wait_or_dump(lambda: status(run.id) == "RUNNING", 60, "the run to be claimed", node)
    os.kill(maintenance.proc.pid, signal.SIGKILL)
    os.kill(busy_worker_pid(run.id), signal.SIGKILL)  # the run now needs maintenance to be taken over
    wait_or_dump(lambda: status(run.id) == "COMPLETED", BOUND + 30, "the run to complete", node, maintenance)
    assert maintenance.exits == [-signal.SIGKILL]  # restarted once by its supervisor
    assert Event.objects.filter(run=run, type="lease.taken_over").exists()


def test_redis_going_away_under_load_and_every_run_completes(deployment, load_agent, submit, tmp_path):
    """Redis carries only wake-ups (channel layer) and the cache: losing it
    must cost no run. A redis-server of our own, killed mid-load."""
    port = free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        import redis as redis_py

        wait_for(lambda: _pings(redis_py, port), timeout=20, message="our redis-server")
        slow_agent(load_agent, steps=4, delay_ms=300)
        node, maintenance = deployment(workers=2, REDIS_URL=f"redis://127.0.0.1:{port}/0")
        runs = [submit(text=f"run {i}") for i in range(4)]
        wait_or_dump(lambda: any(status(r.id) == "RUNNING" for r in runs), 60, "a run mid-step", node)
        redis.kill()
        redis.wait()
        runs += [submit(text=f"after {i}") for i in range(2)]
        wait_or_dump(lambda: all_completed(runs), BOUND + 30, "every run to complete without Redis", node, maintenance)
        assert node.exits == [] and maintenance.exits == []
    finally:
        if redis.poll() is None:
            redis.kill()
            redis.wait()


def _pings(redis_py, port) -> bool:
    try:
        return redis_py.Redis(port=port, socket_connect_timeout=0.2).ping()
    except Exception:
        return False


def test_a_web_node_sigkilled_is_restarted_and_serves_again(transactional_db, tmp_path):
    import urllib.request

    port = free_port()
    web = Supervised(
        "web",
        ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "agentrt_site.asgi:application"],
        subprocess_env(),
        tmp_path / "web.log",
    )

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        wait_or_dump(healthy, 60, "the web node", web)
        first = web.proc
        os.kill(first.pid, signal.SIGKILL)
        wait_or_dump(lambda: web.proc is not first, 30, "the supervisor to restart the web node", web)
        wait_or_dump(healthy, 60, "the restarted web node", web)
        assert web.exits == [-signal.SIGKILL]
    finally:
        web.stop()


def test_random_sigkills_of_cluster_processes_under_load(deployment, load_agent, submit):
    """Kills at random moments, of random roles, while short steps keep every
    queue lock busy; afterwards the node serves and every run completes.
    AGENTRT_TEST_KILLS raises the count for a longer run by hand."""
    import random

    rng = random.Random(int(os.environ.get("AGENTRT_TEST_KILL_SEED", "1414")))
    kills = int(os.environ.get("AGENTRT_TEST_KILLS", "12"))
    load_agent(
        turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": str(i)}}], "delay_ms": 20} for i in range(3)]
        + [{"text": "done"}],
        limits={"max_steps": 8},
    )
    node, maintenance = deployment(workers=2)
    runs = [submit(text=f"seed {i}") for i in range(4)]
    done_kills: dict[str, int] = {}
    for k in range(kills):
        r = wait_or_dump(lambda: node_ready(node, 1), 90, f"the node to be up before kill {k}", node)
        role = rng.choice(["qc-worker", "qc-worker", "qc-worker", "qc-pusher", "qc-monitor", "qc-sentinel", "main"])
        pid = node.proc.pid if role == "main" else rng.choice(r[role])
        runs += [submit(text=f"k{k} {i}") for i in range(2)]
        # A random moment, not a condition: the kill must land anywhere in the
        # processes' lives (starting, idle in get(), mid-step, handing back).
        threading.Event().wait(rng.random() * 0.6)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        done_kills[role] = done_kills.get(role, 0) + 1
    wait_or_dump(
        lambda: all_completed(runs), BOUND + 60, f"every run to complete after kills {done_kills}", node, maintenance
    )
    after = [submit(text=f"after {i}") for i in range(3)]
    wait_or_dump(lambda: all_completed(after), BOUND, "runs submitted after the last kill", node, maintenance)
    assert sum(done_kills.values()) >= kills // 2


def test_a_stalled_sentinel_is_killed_by_its_main_process_and_the_node_restarts(deployment, load_agent, submit):
    """SIGSTOP stands for a sentinel wedged for any reason: it completes no
    guard cycle, so nothing would replace a dead worker. The main process
    kills it and exits 1; the supervisor starts a fresh node."""
    load_agent()
    node, _ = deployment(workers=1, AGENTRT_SENTINEL_STALL_SECONDS=3)
    warm = submit(text="warm")
    wait_or_dump(lambda: status(warm.id) == "COMPLETED", 60, "the warm-up run", node)
    r = wait_for(lambda: node_ready(node, 1), timeout=30, message="the node's processes")
    main = node.proc
    os.kill(r["qc-sentinel"][0], signal.SIGSTOP)
    wait_or_dump(lambda: node.proc is not main, BOUND, "the main process to give up on its stalled sentinel", node)
    assert node.exits[0] == 1
    run = submit(text="after")
    wait_or_dump(lambda: status(run.id) == "COMPLETED", BOUND, "a run on the restarted node", node)
    wait_or_dump(lambda: not in_sessions({main.pid}), 60, "the stalled generation's processes to exit", node)
