"""Supervision around django-q2's cluster: any of its processes may be
SIGKILLed at any moment and the node heals itself, or exits non-zero for its
supervisor (systemd, the demo) to restart it.

Applied the way runs/drain.py patches django-q2, from RunsConfig.ready().
"""
from __future__ import annotations

import ctypes
import logging
import os
import uuid

from django_q import cluster as q_cluster
from django_q.conf import Conf

log = logging.getLogger("agentrt.qheal")

PR_SET_NAME = 15


def name_process(name: str) -> None:
    """Set the kernel's name of this process (`ps -o comm`, /proc/PID/comm),
    so an operator — and the fault tests — can tell the roles apart."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except Exception:  # not Linux: names are a convenience
        pass


def _role(target) -> str:
    if target is q_cluster.worker:
        return "qc-worker"
    if target is q_cluster.pusher:
        return "qc-pusher"
    if target is q_cluster.monitor:
        return "qc-monitor"
    return "qc-child"


def _child_main(target, role, *args):
    name_process(role)
    return target(*args)


def spawn_process(self, target, *args):
    """django-q2's spawn_process, with each child named after its role."""
    p = q_cluster.get_mp_context().Process(
        target=_child_main, args=(target, _role(target)) + args, name=f"Process-{uuid.uuid4().hex}"
    )
    p.daemon = True
    if target is q_cluster.worker:
        p.daemon = Conf.DAEMONIZE_WORKERS
        p.timer = args[2]
        self.pool.append(p)
    p.start()
    return p


def patch() -> None:
    if getattr(q_cluster.Sentinel, "_agentrt_qheal", False):
        return
    original_start = q_cluster.Sentinel.start

    def start(self):
        name_process("qc-sentinel")
        return original_start(self)

    q_cluster.Sentinel.spawn_process = spawn_process
    q_cluster.Sentinel.start = start
    q_cluster.Sentinel._agentrt_qheal = True
