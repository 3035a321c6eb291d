"""A private PostgreSQL 15 cluster for the chaos soak.

The soak restarts PostgreSQL once and terminates backends at random, so it
never runs against a shared server: it initdb's a cluster of its own into a
temporary directory, as the `postgres` OS user when run as root (initdb and
the server refuse to run as root), on a free port, and removes it at the end.
fsync stays on: a restart in `immediate` mode is a crash, and what the
runtime committed must survive it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tests.conftest import free_port

BIN = Path(os.environ.get("AGENTRT_PG_BIN", "/usr/lib/postgresql/15/bin"))


class PrivatePostgres:
    """initdb + pg_ctl into a temporary directory; `url(name)` for a database on it."""

    def __init__(self, max_connections: int = 300):
        self.max_connections = max_connections
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="agentrt-soak-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "postgres.log"
        self.restarts: list[dict] = []
        self.as_postgres = os.geteuid() == 0

    def _run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
        # output to a file, never a pipe: a server pg_ctl starts inherits it and would hold a pipe open
        cmd = [str(BIN / argv[0]), *argv[1:]]
        if self.as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        with tempfile.TemporaryFile() as out:
            done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=timeout)
            if done.returncode:
                out.seek(0)
                raise RuntimeError(
                    f"{' '.join(argv)} exited {done.returncode}: {out.read().decode(errors='replace')[-2000:]}"
                )
            return done

    def start(self) -> PrivatePostgres:
        if self.as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
        os.chmod(self.dir, 0o700)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        opts = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} -c max_connections={self.max_connections}"
            " -c shared_buffers=64MB -c log_min_messages=warning"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w", "-t", "60", "start")
        return self

    def url(self, name: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    def restart(self, mode: str = "immediate") -> dict:
        """Stop (immediate: every backend dies at once, as in a crash) and start
        again with the same options; returns when it accepts connections."""
        t0 = time.time()
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-m", mode, "-w", "-t", "120", "restart")
        entry = {"mode": mode, "t_stop": t0, "t_ready": time.time()}
        self.restarts.append(entry)
        return entry

    def stop(self, keep_log: Path | None = None) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", timeout=60)
        except (RuntimeError, subprocess.TimeoutExpired, FileNotFoundError):
            pass
        if keep_log is not None and self.log.exists():
            shutil.copyfile(self.log, keep_log)
        shutil.rmtree(self.dir, ignore_errors=True)
