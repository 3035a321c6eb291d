"""Processes read from /proc, for the tests that watch real process trees
(who a process's children are, which processes a session still holds)."""

from __future__ import annotations

import os


def stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state, ppid,
    pgrp, session, ...), or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()
    except OSError:
        return None


def comm(pid: int) -> str:
    """The process's kernel name (`qc-worker`, `daphne`, ...), or '' if gone."""
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _live_where(field: int, values: set[int]) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := stat(int(entry))) and fields[0] != "Z" and int(fields[field]) in values:
            found.append(int(entry))
    return found


def children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is `pid`."""
    return _live_where(1, {pid})


def in_sessions(sids: set[int]) -> list[int]:
    """Live (not zombie) processes of the given sessions."""
    return _live_where(3, sids)
