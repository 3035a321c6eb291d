"""Fault points, active only when AGENTRT_ENABLE_FAULTPOINTS=1.

`AGENTRT_FAULTPOINTS="point=action,..."`; actions `kill`, `stop`,
`sleep:SECONDS`, `raise`, `pause`. Each point fires once per run: it first
creates the marker `<point>.<run>` in AGENTRT_FAULTPOINT_DIR and does nothing
if the marker exists, so a restarted worker does not fire again.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from django.conf import settings

POINTS = (
    "model.before_call",
    "model.after_call",
    "tool.before_watermark",
    "tool.after_watermark",
    "tool.after_execute",
    # A long operation's handle (an MCP task id) is committed to the call's record; nothing more of it is done yet.
    "tool.after_remote_recorded",
    "checkpoint.before_write",
    "finalize.before_transition",
    "finalize.after_transition",
    "resume.after_takeover",
    "sweep.after_select",
    # A webhook's answer is in (a 2xx, say), its attempt not yet recorded; keyed by the delivery id, not a run's.
    "webhook.after_send",
)


class FaultInjected(Exception):
    """Raised by the `raise` action."""


def _plan() -> dict[str, str]:
    plan = {}
    for item in settings.AGENTRT_FAULTPOINTS.split(","):
        if "=" in item:
            point, action = item.split("=", 1)
            plan[point.strip()] = action.strip()
    return plan


def fire(point: str, run_id) -> None:
    if not settings.AGENTRT_ENABLE_FAULTPOINTS:
        return
    action = _plan().get(point)
    if not action:
        return
    folder = Path(settings.AGENTRT_FAULTPOINT_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / f"{point}.{run_id}"
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, str(os.getpid()).encode())  # who fired: tests SIGCONT a stopped worker by it
    os.close(fd)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif action.startswith("sleep:"):
        time.sleep(float(action.split(":", 1)[1]))
    elif action == "raise":
        raise FaultInjected(point)
    elif action == "pause":
        (folder / f"{point}.{run_id}.paused").touch()
        go = folder / f"{point}.{run_id}.go"
        while not go.exists():
            time.sleep(0.02)


def hook_for(run_id):
    return lambda point: fire(point, run_id)
