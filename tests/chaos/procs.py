"""Process and database plumbing for the chaos soak: children in their own
sessions, the process tree and states read from /proc (no psutil), and the
soak's own throw-away database."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[2]


def recreate_database(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if not name or '"' in name:
        raise SystemExit(f"bad database name in {url!r}")
    server = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(server, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


# -- processes -------------------------------------------------------------------


class Proc:
    """A supervised child process in its own session (so its whole group can
    be signalled). The soak is its supervisor, as systemd's
    Restart=on-failure would be: `restart()` starts a new generation after it
    exited; `stop()` ends every generation (an orphaned old one may still be
    draining)."""

    def __init__(self, name: str, argv: list[str], env: dict, log_path: Path, role: str | None = None):
        self.name = name
        self.role = role or name
        self.argv, self.env = argv, env
        self.log_path = log_path
        self.generations: list[subprocess.Popen] = []
        self.exits: list[dict] = []
        self._start()

    def _start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.pid = self.proc.pid
        self.generations.append(self.proc)
        self.started_at = time.time()
        self.ready = False  # the supervisor's readiness probe says when it serves (web nodes)
        self.ready_at: float | None = None

    def exited(self) -> int | None:
        return self.proc.poll()

    def restart(self) -> None:
        self._start()

    def group(self, sig) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.group(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        for p in self.generations:
            try:
                os.killpg(p.pid, signal.SIGCONT)
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, state) for every process, from /proc/<pid>/stat."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                data = fh.read()
        except OSError:
            continue
        rest = data.rpartition(")")[2].split()
        if len(rest) >= 2:
            out[int(name)] = (int(rest[1]), rest[0])
    return out


def descendants(root: int, table: dict[int, tuple[int, str]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, stack = set(), [root]
    while stack:
        for c in children.get(stack.pop(), []):
            if c not in out:
                out.add(c)
                stack.append(c)
    return out


def proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None
