"""Wake live sockets after a commit, off the step's path.

A commit only records which groups have news (the run's and its tenant's);
one daemon thread per process sends the wake-ups over the channel layer,
coalescing whatever piled up while it was sending. Sending inline cost two
channel-layer round trips per commit, each through `async_to_sync`, on the
worker's critical path. The wake-up is a hint, at most once by design:
consumers read the events table past their cursor and poll as a fallback,
so a lost wake-up delays a page by at most its poll interval and loses
nothing.
"""

from __future__ import annotations

import asyncio
import os
import threading

# Wake-ups are batched at most this often per process: a page learns of new
# events within this interval, and a busy worker sends a few batches a second
# per run instead of two messages per commit.
MIN_INTERVAL_SECONDS = 0.05


class Waker:
    def __init__(self) -> None:
        self._reset()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reset)  # the thread does not survive a fork

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[str, None] = {}
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self.sent = 0  # wake-ups handed to the layer (for tests and diagnostics)

    def wake(self, run_id, tenant_id) -> None:
        from runs.web.consumers import run_group, tenant_group

        with self._lock:
            if run_id is not None:
                self._groups[run_group(run_id)] = None
            self._groups[tenant_group(tenant_id)] = None
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="agentrt-wake", daemon=True)
                self._thread.start()
        self._ready.set()

    def _serve(self) -> None:
        from channels.layers import get_channel_layer

        from runs.clock import CLOCK

        loop = asyncio.new_event_loop()
        while True:
            self._ready.wait()
            self._ready.clear()
            with self._lock:
                groups, self._groups = list(self._groups), {}
            layer = get_channel_layer()
            for group in groups:
                try:
                    loop.run_until_complete(layer.group_send(group, {"type": "run.wake"}))
                    self.sent += 1
                except Exception:  # at most once by design; the consumers' poll delivers anyway
                    pass
            CLOCK.sleep(MIN_INTERVAL_SECONDS)  # let the next hints pile up: one batch covers them all


waker = Waker()
