"""Graceful stop of a worker cluster: finish the current step, yield, exit.

django-q2's sentinel, on SIGTERM/SIGINT, stops handing out tasks and waits
for each worker to finish the task it is running — which for `drive_run`
could be a whole slice. So before the sentinel's own stop procedure we
signal every worker (SIGUSR1); a worker that receives it (or SIGTERM/SIGINT
sent to the whole process group) asks its executing run to yield at the next
step boundary: `finalize` puts it back to QUEUED, releases the lease and
rings the doorbell, so another node takes it over at once.
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger("agentrt.drain")


def _on_signal(signum, frame):
    from runs.runtime.executor import request_drain

    request_drain()


def install_worker_handlers(sender=None, proc_name=None, **kwargs) -> None:
    """post_spawn receiver: runs in each django-q2 worker process."""
    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _on_signal)


def patch_sentinel() -> None:
    """Make the sentinel tell its workers to drain before it stops them."""
    from django_q import cluster

    if getattr(cluster.Sentinel.stop, "_agentrt", False):
        return
    original = cluster.Sentinel.stop

    def stop(self):
        for proc in list(getattr(self, "pool", [])):
            try:
                os.kill(proc.pid, signal.SIGUSR1)
            except (ProcessLookupError, TypeError):
                pass
        return original(self)

    stop._agentrt = True
    cluster.Sentinel.stop = stop


def connect() -> None:
    from django_q.signals import post_spawn

    from runs.runtime import qheal

    post_spawn.connect(install_worker_handlers, dispatch_uid="agentrt.drain")
    qheal.patch()  # first: the drain's stop wraps the supervised one
    patch_sentinel()
