"""Process supervision shared by `manage.py demo` (what `make run` runs) and
`manage.py cluster` (what `make cluster` runs): start children so that a
stop reaches each exactly once, stop them as a whole, and find what a
process left behind.

Each child runs in its own session: a Ctrl-C in the terminal, or a signal to
the supervisor's process group, reaches it only through the supervisor, once.
The kernel is told to SIGTERM the child if the supervisor dies without a
chance to stop it (`PR_SET_PDEATHSIG`, Linux). A stop sends SIGTERM to each
child's **main process only** — as systemd's `KillMode=mixed` does: the
`qcluster` main process then drains its cluster in order (a SIGTERM to the
whole group would leave django-q2's sentinel waiting) — waits up to a grace,
and then SIGKILLs whatever is left of each child's session.

Under `make`, the supervisor also watches make itself (`watch_parent`): a
stop signal make takes but does not pass on stops the supervisor too."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import urllib.request
from collections.abc import Callable, Sequence

from runs.clock import CLOCK

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
STOP_GRACE_SECONDS = 60  # a worker finishes its step and yields; then what is left is killed
PR_SET_PDEATHSIG = 1


def _stop_with_parent() -> None:
    """In the child, before exec: SIGTERM it when the supervisor dies (Linux)."""
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except Exception:
        pass


MAKES = ("make", "gmake")


def _caught(pid: int) -> int | None:
    """The mask of signals process `pid` has a handler for (/proc, Linux), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("SigCgt:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        return None
    return None


def watch_parent() -> Callable[[], str | None]:
    """Call once at start: a function that says, each time it is called,
    why this supervisor should stop because of its parent (None: no reason).

    Under `make` (`make run`, `make cluster`, whose recipes `exec` the
    supervisor, so make is its parent): make forwards a SIGTERM to its
    recipe, but a SIGHUP or SIGINT sent to make's process alone it only
    answers by waiting for its recipe to end, then dying of the signal — so
    that nothing would ever stop. GNU make puts that signal's handler back to
    the default first (and re-raises it once its recipe has ended), which
    /proc shows: the watch reads make's caught signals and names the stop
    signal make no longer catches. It also asks the kernel to SIGTERM this
    process if make dies outright (`PR_SET_PDEATHSIG`), and says so if make
    is gone already. Under any other parent (a shell, systemd, a test) it
    never gives a reason: those deliver their stops to this process."""
    parent = os.getppid()
    if comm(parent) not in MAKES:
        return lambda: None
    _stop_with_parent()
    at_start = _caught(parent) or 0
    watched = [sig for sig in STOP_SIGNALS if at_start & (1 << (sig - 1))]

    def reason() -> str | None:
        if os.getppid() != parent:
            return "make exited"
        now = _caught(parent)
        if now is None:
            return "make exited"
        for sig in watched:
            if not now & (1 << (sig - 1)):
                return f"{signal.Signals(sig).name} to make"
        return None

    return reason


def start_child(args: Sequence[str], env: dict, *, stdout=None, cwd=None) -> subprocess.Popen:
    """Start `args` in a session of its own, stopped by the kernel with its supervisor."""
    return subprocess.Popen(
        list(args),
        env=env,
        cwd=cwd,
        stdout=stdout,
        stderr=subprocess.STDOUT if stdout is not None else None,
        start_new_session=True,
        preexec_fn=_stop_with_parent,
    )


def answers(port: int, path: str) -> bool:
    """Whether the web server on this host's `port` answers `path` with 200:
    it is past its start-up (a daphne that has bound its port may not be
    handling signals yet) and serving."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return resp.status == 200
    except Exception:
        return False


def session_alive(sid: int) -> bool:
    """Whether any process of session `sid` still runs (a child's session id is its pid)."""
    try:
        os.killpg(sid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def kill_session(sid: int) -> None:
    try:
        os.killpg(sid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stop_children(
    procs: Sequence[subprocess.Popen],
    names: Sequence[str],
    write: Callable[[str], None],
    grace: float = STOP_GRACE_SECONDS,
    leftovers: Sequence[int] = (),
) -> None:
    """SIGTERM each child's main process, wait up to `grace` seconds for all of
    them, then SIGKILL what is left of each child's session (and of the
    `leftovers` sessions: children that exited earlier and left processes
    draining). Writes one line: `stopped: NAME CODE, ...`."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)  # qcluster drains; daphne and maintenance exit
    deadline = CLOCK.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - CLOCK.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for sid in leftovers:  # sessions of earlier incarnations, if anything of them still drains
        while session_alive(sid) and CLOCK.monotonic() < deadline:
            CLOCK.sleep(0.1)
    for p in procs:  # whatever is left of each child's session (e.g. a wedged worker)
        kill_session(p.pid)
        p.wait()
    for sid in leftovers:
        kill_session(sid)
    write("stopped: " + ", ".join(f"{n} {p.returncode}" for n, p in zip(names, procs, strict=True)))


def descendants(pid: int) -> list[int]:
    """Live (not zombie) descendants of `pid`, read from /proc (Linux)."""
    parent_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rpartition(")")[2].split()
        except OSError:
            continue
        if fields and fields[0] != "Z":
            parent_of[int(entry)] = int(fields[1])
    found: list[int] = []
    frontier = {pid}
    while frontier:
        kids = {c for c, p in parent_of.items() if p in frontier and c not in found}
        found.extend(kids)
        frontier = kids
    return found


def comm(pid: int) -> str:
    """The kernel's name of a process (`qc-worker`, ...), or '' if it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""
