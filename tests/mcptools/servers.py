"""Real MCP servers from PyPI for the MCP tests (issue 36), in a venv of their own.

`mcp-server-time` and `mcp-server-git` are installed the way a user would —
`python -m venv`, then `pip install --require-hashes` of
tests/mcptools/requirements-servers.txt — into var/mcp-servers, once: the
marker holds the lock's digest, so a changed lock installs again and an
unchanged one costs nothing. `make test` does it before pytest starts
(`python -m tests.mcptools.servers`); the session fixture `mcp_venv` does the
same (under a file lock: the xdist workers share one venv), so a fresh
clone's `pytest` needs nothing more.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCK = Path(__file__).resolve().parent / "requirements-servers.txt"
VENV = Path(os.environ.get("AGENTRT_TEST_MCP_VENV", ROOT / "var" / "mcp-servers"))
EFFECTS_SERVER = Path(__file__).resolve().parent / "effects_server.py"


def _digest() -> str:
    return hashlib.sha256(LOCK.read_bytes()).hexdigest()


def bin_path(name: str) -> str:
    return str(VENV / "bin" / name)


def ensure() -> Path:
    """The venv with the servers installed (installed first if it is not)."""
    marker = VENV / ".installed"
    if marker.exists() and marker.read_text().strip() == _digest():
        return VENV
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / "mcp-servers.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists() and marker.read_text().strip() == _digest():
            return VENV
        base = getattr(sys, "_base_executable", None) or sys.executable
        if not (VENV / "bin" / "python").exists():
            subprocess.run([base, "-m", "venv", str(VENV)], check=True)
        subprocess.run(
            [
                str(VENV / "bin" / "pip"),
                "install",
                "-q",
                "--disable-pip-version-check",
                "--require-hashes",
                "-r",
                str(LOCK),
            ],
            check=True,
        )
        marker.write_text(_digest())
    return VENV


if __name__ == "__main__":
    print(ensure())
