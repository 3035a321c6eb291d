"""Per-process latency histograms of a worker node, served on
`AGENTRT_METRICS_PORT` by the `qcluster` main process.

django-q2 forks its workers from the sentinel, so the histograms use
prometheus_client's multiprocess mode: each worker writes its own files in
`PROMETHEUS_MULTIPROC_DIR` and the node's endpoint sums them. The directory
must be set before prometheus_client is first imported in the process tree
(django-q2's conf imports it while apps load), so settings.py calls
`prepare_if_worker_node` (a fresh directory per node start, or the
operator's, emptied: a restarted node starts from zero, as any restarted
exporter does) and `AppConfig.ready` starts the endpoint. Files of dead workers are kept: their
counts are part of the node's totals and counters must not go down; their
live-gauge files are removed (`mark_process_dead`).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
from pathlib import Path

log = logging.getLogger("agentrt.ops")

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_metrics: dict = {}
_lock = threading.Lock()


def enabled() -> bool:
    return bool(os.environ.get("AGENTRT_METRICS_PORT"))


def histograms() -> dict:
    """The four histograms, created on first use (after the directory is set)."""
    if not _metrics:
        with _lock:
            if not _metrics:
                from prometheus_client import Histogram

                _metrics.update(
                    step=Histogram(
                        "agent_step_seconds",
                        "One step: the model call through its tool batch's commit.",
                        buckets=LATENCY_BUCKETS,
                    ),
                    model=Histogram(
                        "agent_model_call_seconds",
                        "One model attempt, by outcome.",
                        ["outcome"],
                        buckets=LATENCY_BUCKETS,
                    ),
                    tool=Histogram(
                        "agent_tool_call_seconds", "One tool execution, by tool.", ["tool"], buckets=LATENCY_BUCKETS
                    ),
                    commit=Histogram(
                        "agent_commit_seconds", "One fenced transaction of the runtime.", buckets=LATENCY_BUCKETS
                    ),
                )
    return _metrics


def _is_worker_node() -> bool:
    return len(sys.argv) > 1 and Path(sys.argv[0]).name == "manage.py" and sys.argv[1] == "qcluster"


def prepare_if_worker_node() -> None:
    """Called from settings, before any app imports prometheus_client."""
    if _is_worker_node() and enabled():
        prepare_dir()


def prepare_dir() -> str:
    """Set (or empty) the multiprocess directory; before prometheus_client is imported."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        Path(path).mkdir(parents=True, exist_ok=True)
        for stale in Path(path).glob("*.db"):
            stale.unlink(missing_ok=True)
    else:
        path = tempfile.mkdtemp(prefix="agentrt-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    if "prometheus_client" in sys.modules:
        log.warning(
            "prometheus_client was imported before PROMETHEUS_MULTIPROC_DIR was set: worker histograms stay per-process"
        )
    return path


def start_if_worker_node() -> None:
    """A node that cannot serve the port it was given stops with the reason
    (a supervisor restarts it; a scrape target that never answers would hide
    the node instead)."""
    if not (_is_worker_node() and enabled()):
        return
    from django.core.exceptions import ImproperlyConfigured

    raw, addr = os.environ["AGENTRT_METRICS_PORT"], os.environ.get("AGENTRT_METRICS_ADDR", "127.0.0.1")
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ImproperlyConfigured(f"AGENTRT_METRICS_PORT must be a TCP port number, not {raw!r}")
    try:
        serve(int(raw), addr)
    except OSError as exc:
        raise ImproperlyConfigured(
            f"AGENTRT_METRICS_PORT {addr}:{raw} cannot be served: {exc.strerror or exc}"
        ) from None


def serve(port: int, addr: str) -> None:
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or prepare_dir()
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=path)
    start_http_server(port, addr=addr, registry=registry)
    threading.Thread(target=_reap, args=(path,), name="agentrt-metrics-reaper", daemon=True).start()
    log.info("worker metrics on %s:%s (%s)", addr, port, path)


def _reap(path: str, interval: float = 30.0) -> None:
    import time

    while True:
        time.sleep(interval)
        try:
            reap_once(path)
        except OSError:
            log.exception("worker metrics: could not reap %s", path)


def reap_once(path: str, me: int | None = None) -> list[int]:
    """Drop the live-gauge files of dead workers (recycled or killed); keep
    their counters and histograms. Return the dead pids."""
    from prometheus_client.multiprocess import mark_process_dead

    me = me or os.getpid()
    pids = set()
    for f in Path(path).glob("*_*.db"):
        tail = f.stem.rsplit("_", 1)[-1]
        if tail.isdigit():
            pids.add(int(tail))
    dead = []
    for pid in sorted(pids - {me}):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            mark_process_dead(pid, path)
            dead.append(pid)
        except PermissionError:
            pass
    return dead
