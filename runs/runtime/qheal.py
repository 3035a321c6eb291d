"""Supervision around django-q2's cluster: any of its processes may be
SIGKILLed at any moment, and the node heals itself or exits non-zero for its
supervisor (systemd, `manage.py demo`) to restart it.

Why django-q2 alone does not survive it: the sentinel's processes share
multiprocessing queues whose locks are POSIX semaphores, and a process
SIGKILLed while holding one never releases it. An idle worker waits in
`task_queue.get()` *holding the queue's reader lock*; kill it there and every
worker the sentinel spawns in its place blocks on that lock forever — the
node claims nothing until a person restarts it. The same holds for the
monitor idle in `result_queue.get()`, a pusher killed while its feeder thread
writes, and a worker killed while it holds its own timer lock (the sentinel's
guard then blocks on it for good).

The cure, applied here the way runs/runtime/drain.py patches django-q2
(contrib/django-q2-heal-queues.patch is the same idea offered upstream):

- The guard treats any death of a worker (other than recycling or a timeout)
  and any death of the pusher or the monitor as possibly corrupting the
  shared queues: it **replaces the task and result queues** and respawns the
  pusher, the monitor and a full pool of workers on the new ones. Idle old
  workers are killed (they hold no lease); busy ones are asked to drain
  (SIGUSR1: yield at the next step boundary) and are killed once idle. A
  doorbell lost with the old queue is rung again by maintenance (the reclaim
  sweep re-enqueues a QUEUED run with no pending doorbell).
- The guard never blocks on a lock another process may hold: timer locks are
  taken with a timeout, queue sizes are read without waiting.
- Each child watches its parent: when the sentinel dies, workers drain and
  exit, the pusher and monitor exit. The sentinel watches the `qcluster` main
  process: when it dies, the sentinel stops the cluster (draining it).
- The `qcluster` main process watches the sentinel: if it dies, or stops
  completing guard cycles, the main process kills it and exits 1 so that its
  supervisor starts a fresh node.
- The stop procedure is bounded: a pusher that does not stop, a worker idle
  for a few seconds without taking its poison pill (its queue is wedged), a
  monitor that does not finish are killed instead of waited on forever.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing.queues
import os
import signal
import sys
import threading
from multiprocessing import Event, RawValue
from queue import Full
from typing import Any

from django import db
from django.conf import settings
from django_q import cluster as q_cluster
from django_q.conf import Conf
from django_q.management.commands import qcluster
from django_q.queues import Queue

from runs.clock import CLOCK, IDS
from runs.runtime.drain import request_drain

log = logging.getLogger("agentrt.qheal")

PR_SET_NAME = 15
STUCK_SECONDS = 5.0  # a timer lock held this long: its holder is wedged or dead
STOP_IDLE_SECONDS = 3.0  # idle this long during stop: the poison pill cannot reach it
STOP_AUX_SECONDS = 10.0  # pusher / monitor given this long to stop on their own
ORPHAN_CHECK_SECONDS = 0.5

_BEAT = {"value": None}  # RawValue('d') shared by the main process and its sentinel: last guard cycle
_CLUSTER = {"cluster": None}


def name_process(name: str) -> None:
    """Set the kernel's name of this process (`ps -o comm`, /proc/PID/comm),
    so an operator — and the fault tests — can tell the roles apart."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except Exception:  # not Linux: names are a convenience
        pass


class HealingQueue(Queue):
    """django-q2's Queue whose size counter never makes anyone wait: the
    counter's lock may belong to a process that was killed holding it (the
    count is then approximate, which only the status page reads)."""

    def _add(self, n: int) -> None:
        lock = self.size.count.get_lock()
        if lock.acquire(timeout=0.05):
            try:
                self.size.count.get_obj().value += n
            finally:
                lock.release()

    def put(self, *args, **kwargs):
        multiprocessing.queues.Queue.put(self, *args, **kwargs)
        self._add(1)

    def get(self, *args, **kwargs):
        item: Any = multiprocessing.queues.Queue.get(self, *args, **kwargs)
        self._add(-1)
        return item

    def qsize(self) -> int:
        lock = self.size.count.get_lock()
        if not lock.acquire(timeout=0.05):
            return 0
        try:
            return self.size.count.get_obj().value
        finally:
            lock.release()

    def empty(self) -> bool:
        return not self.qsize() > 0


def _new_queues(sentinel) -> None:
    sentinel.task_queue = HealingQueue(maxsize=Conf.QUEUE_LIMIT) if Conf.QUEUE_LIMIT else HealingQueue()
    sentinel.result_queue = HealingQueue()
    sentinel.event_out = Event()


def _read_timer(p):
    """The worker's timer (-1 idle, >0 busy, 0 timed out, -2 recycled), or
    None when its lock cannot be had at once."""
    lock = p.timer.get_lock()
    if not lock.acquire(timeout=0.05):
        return None
    try:
        return p.timer.get_obj().value
    finally:
        lock.release()


def _kill(p) -> None:
    try:
        os.kill(p.pid, signal.SIGKILL)
    except (ProcessLookupError, TypeError):
        pass
    p.join(timeout=2)


def _signal(p, sig) -> None:
    try:
        os.kill(p.pid, sig)
    except (ProcessLookupError, TypeError):
        pass


def _beat() -> None:
    if _BEAT["value"] is not None:
        _BEAT["value"].value = CLOCK.monotonic()


def _save_stat(sentinel) -> None:
    try:
        q_cluster.Stat(sentinel).save()
    except Exception:
        log.exception("could not save the cluster's status")


# --- children -----------------------------------------------------------------


def _role(target) -> str:
    if target is q_cluster.worker:
        return "qc-worker"
    if target is q_cluster.pusher:
        return "qc-pusher"
    if target is q_cluster.monitor:
        return "qc-monitor"
    return "qc-child"


def _watch_parent(parent: int, timer) -> None:
    """In each child: when the sentinel is gone, a worker drains (its run
    yields at the next step boundary) and exits once idle; the pusher and the
    monitor exit at once (their in-memory tasks come back as lost doorbells)."""
    draining = False
    while True:
        CLOCK.sleep(ORPHAN_CHECK_SECONDS)
        if os.getppid() == parent:
            continue
        if timer is None:
            os._exit(0)
        if not draining:
            request_drain()
            draining = True
        if timer.get_obj().value in (-1, -2, 0):
            os._exit(0)


def _child_main(target, role, parent, *args):
    name_process(role)
    timer = args[2] if target is q_cluster.worker else None
    threading.Thread(target=_watch_parent, args=(parent, timer), name="orphan-watch", daemon=True).start()
    return target(*args)


def spawn_process(self, target, *args):
    """django-q2's spawn_process: each child named after its role and watching its parent."""
    p = q_cluster.get_mp_context().Process(
        target=_child_main, args=(target, _role(target), os.getpid()) + args, name=f"Process-{IDS.new_id().hex}"
    )
    p.daemon = True
    if target is q_cluster.worker:
        p.daemon = Conf.DAEMONIZE_WORKERS
        p.timer = args[2]
        self.pool.append(p)
    p.start()
    return p


# --- the sentinel ---------------------------------------------------------------


def _check_pool(self, cycle: float, original_reincarnate) -> list[str]:
    """One pass over the workers; returns the abnormal deaths seen."""
    broken = []
    stuck = self.__dict__.setdefault("_agentrt_stuck", {})
    for p in list(self.pool):
        value = _read_timer(p)
        alive = p.is_alive()
        if value is None:
            if not alive:
                broken.append(f"worker {p.pid} died holding its timer lock")
                self.pool.remove(p)
                continue
            since = stuck.setdefault(p.pid, CLOCK.monotonic())
            if CLOCK.monotonic() - since > STUCK_SECONDS:
                log.critical("worker %s has held its timer lock for %.0f s; killing it", p.pid, STUCK_SECONDS)
                _kill(p)
            continue
        stuck.pop(p.pid, None)
        if value == -2 and not alive:
            original_reincarnate(self, p)  # recycled: a clean exit
        elif value == 0:
            original_reincarnate(self, p)  # timed out: django-q2's own handling
        elif not alive:
            broken.append(f"worker {p.pid} died (exit code {p.exitcode})")
            self.pool.remove(p)
        elif value > 0:
            lock = p.timer.get_lock()
            if lock.acquire(timeout=0.05):
                try:
                    if p.timer.get_obj().value > 0:
                        p.timer.get_obj().value -= cycle
                finally:
                    lock.release()
    return broken


def _retire_old(self) -> None:
    """Workers of a replaced queue: killed once idle (or past their timeout)."""
    retiring = self.__dict__.setdefault("_agentrt_retiring", [])
    stuck = self.__dict__.setdefault("_agentrt_stuck", {})
    for p in list(retiring):
        if not p.is_alive():
            p.join(timeout=0)
            retiring.remove(p)
            continue
        value = _read_timer(p)
        if value is None:
            since = stuck.setdefault(p.pid, CLOCK.monotonic())
            if CLOCK.monotonic() - since > STUCK_SECONDS:
                _kill(p)
            continue
        stuck.pop(p.pid, None)
        if value <= 0:
            _kill(p)
        else:
            lock = p.timer.get_lock()
            if lock.acquire(timeout=0.05):
                try:
                    p.timer.get_obj().value = max(0.0, p.timer.get_obj().value - Conf.GUARD_CYCLE)
                finally:
                    lock.release()


def rebuild(self, reasons: list[str]) -> None:
    """Replace the shared queues and respawn pusher, monitor and workers."""
    for proc in (self.pusher, self.monitor):
        if proc is not None and proc.is_alive():
            _kill(proc)
    retiring = self.__dict__.setdefault("_agentrt_retiring", [])
    for p in list(self.pool):
        value = _read_timer(p)
        if value is not None and value > 0:
            _signal(p, signal.SIGUSR1)  # busy: yield the run at the next step boundary
            retiring.append(p)
        else:
            _kill(p)  # idle (or wedged): holds no lease
    self.pool = []
    _new_queues(self)
    if not Conf.SYNC:
        db.connections.close_all()
    for _ in range(self.pool_size):
        self.spawn_worker()
    self.monitor = self.spawn_monitor()
    self.pusher = self.spawn_pusher()
    self.reincarnations += 1
    # the new pids are named: an operator (and the chaos checker) can tie a
    # worker that lived only seconds to its node
    log.critical(
        "cluster %s: %s; reincarnated pusher %s, monitor %s and workers %s on new task and result queues",
        q_cluster.humanize(self.cluster_id.hex),
        "; ".join(reasons),
        self.pusher.pid,
        self.monitor.pid,
        sorted(p.pid for p in self.pool),
    )


def guard(self):
    """django-q2's guard loop, made to survive the death of any child."""
    original_reincarnate = _ORIGINAL["reincarnate"]
    name = q_cluster.humanize(self.cluster_id.hex)
    log.info("%s guarding cluster %s [%s]", q_cluster.current_process().name, name, self.queue_name())
    self.start_event.set()
    _save_stat(self)
    counter = 0
    cycle = Conf.GUARD_CYCLE
    while True:
        _beat()
        try:
            if os.getppid() != self.parent_pid:
                log.critical("cluster %s: the qcluster main process %s is gone; stopping", name, self.parent_pid)
                break
            broken = _check_pool(self, cycle, original_reincarnate)
            if not self.monitor.is_alive():
                broken.append(f"monitor {self.monitor.pid} died (exit code {self.monitor.exitcode})")
            if not self.pusher.is_alive():
                broken.append(f"pusher {self.pusher.pid} died (exit code {self.pusher.exitcode})")
            if broken:
                rebuild(self, broken)
            _retire_old(self)
            counter += cycle
            if counter >= 30 and Conf.SCHEDULER:
                counter = 0
                q_cluster.scheduler(broker=self.broker)
            _save_stat(self)
        except Exception:  # e.g. the database went away under the scheduler
            log.exception("cluster %s: guard cycle failed; continuing", name)
            try:
                db.connections.close_all()
            except Exception:
                pass
        if self.stop_event.wait(cycle):
            break
    self.stop()


def stop(self):
    """django-q2's stop procedure, bounded: nothing is waited on forever."""
    _save_stat(self)
    log.info("%s stopping cluster processes", q_cluster.current_process().name)
    retiring = self.__dict__.setdefault("_agentrt_retiring", [])
    for p in retiring:
        _signal(p, signal.SIGUSR1)
    self.event_out.set()
    deadline = CLOCK.monotonic() + STOP_AUX_SECONDS
    while self.pusher.is_alive() and CLOCK.monotonic() < deadline:
        _beat()
        CLOCK.sleep(0.1)
    if self.pusher.is_alive():
        _kill(self.pusher)
    # Poison pills behind the tasks already prefetched: workers drain them first.
    for _ in range(len(self.pool)):
        try:
            self.task_queue.put("STOP", timeout=1)
        except Full:
            break
    self.task_queue.cancel_join_thread()  # a wedged queue must not hold our exit
    workers = list(self.pool) + list(retiring)
    idle_since: dict[int, float] = {}
    while workers:
        _beat()
        for p in list(workers):
            if not p.is_alive():
                p.join(timeout=0)
                workers.remove(p)
                continue
            value = _read_timer(p)
            if value is None or value <= 0:
                since = idle_since.setdefault(p.pid, CLOCK.monotonic())
                if CLOCK.monotonic() - since > STOP_IDLE_SECONDS:
                    _kill(p)
            else:
                idle_since.pop(p.pid, None)
        self.pool = [p for p in self.pool if p in workers]
        CLOCK.sleep(0.1)
        _save_stat(self)
    self.pool = []
    retiring.clear()
    try:
        self.result_queue.put("STOP", timeout=1)
    except Full:
        pass
    self.result_queue.cancel_join_thread()
    deadline = CLOCK.monotonic() + STOP_AUX_SECONDS
    while self.monitor.is_alive() and CLOCK.monotonic() < deadline:
        _beat()
        CLOCK.sleep(0.1)
    if self.monitor.is_alive():
        log.warning("the monitor did not finish in %.0f s; killing it", STOP_AUX_SECONDS)
        _kill(self.monitor)
    _save_stat(self)


# --- the qcluster main process ----------------------------------------------------


def cluster_start(self):
    _BEAT["value"] = RawValue("d", 0.0)
    _CLUSTER["cluster"] = self
    return _ORIGINAL["cluster_start"](self)


def supervise(c) -> None:
    """Block while the sentinel lives; exit 1 if it dies without being asked to stop."""
    stall = float(settings.AGENTRT_SENTINEL_STALL_SECONDS)
    while c.sentinel.is_alive():
        c.sentinel.join(timeout=min(1.0, stall / 3))
        beat = _BEAT["value"].value if _BEAT["value"] is not None else 0.0
        stopping = c.stop_event is None or c.stop_event.is_set()
        if beat and not stopping and CLOCK.monotonic() - beat > stall and c.sentinel.is_alive():
            log.critical("the sentinel %s completed no guard cycle in %.0f s; killing it", c.sentinel.pid, stall)
            try:
                os.kill(c.sentinel.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    asked = c.stop_event is None or c.stop_event.is_set()
    if asked and c.sentinel.exitcode == 0:
        return
    log.critical(
        "the sentinel exited (exit code %s) without being asked to stop; exiting 1 for the supervisor "
        "to restart this node",
        c.sentinel.exitcode,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def qcluster_handle(self, *args, **options):
    _ORIGINAL["handle"](self, *args, **options)
    c = _CLUSTER["cluster"]
    if c is not None and c.sentinel is not None and not options.get("run_once"):
        supervise(c)


_ORIGINAL: dict = {}


def patch() -> None:
    if getattr(q_cluster.Sentinel, "_agentrt_qheal", False):
        return

    _ORIGINAL.update(
        reincarnate=q_cluster.Sentinel.reincarnate,
        cluster_start=q_cluster.Cluster.start,
        handle=qcluster.Command.handle,
    )

    original_init = q_cluster.Sentinel.__init__

    def init(self, stop_event, start_event, cluster_id, broker=None, timeout=None, start=True):
        name_process("qc-sentinel")
        original_init(self, stop_event, start_event, cluster_id, broker=broker, timeout=timeout, start=False)
        _new_queues(self)  # healing queues from the start
        if start:
            self.start()

    q_cluster.Sentinel.__init__ = init
    q_cluster.Sentinel.spawn_process = spawn_process
    q_cluster.Sentinel.guard = guard
    q_cluster.Sentinel.stop = stop
    q_cluster.Cluster.start = cluster_start
    qcluster.Command.handle = qcluster_handle
    q_cluster.Sentinel._agentrt_qheal = True
