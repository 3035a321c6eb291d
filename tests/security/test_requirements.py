"""Issue 10 item 13: the runtime lock is hashed and holds exactly the pinned
direct dependencies of requirements.in; test tools are only in the dev lock.
(A fresh `pip install --require-hashes` of both locks was run by hand.)"""

from __future__ import annotations

import re

from tests.conftest import ROOT

TEST_TOOLS = {"pytest", "pytest-django", "pytest-timeout", "schemathesis", "pytest-asyncio", "playwright", "pip-tools"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path) -> dict[str, str]:
    """name -> version of every `name==version` requirement line (extras stripped)."""
    out = {}
    for line in (ROOT / path).read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)(\[[^\]]*\])?==([^\s\\;]+)", line)
        if m:
            out[_norm(m.group(1))] = m.group(3)
    return out


def blocks(path) -> list[str]:
    """Each requirement of a pip-compile output with its continuation lines."""
    text = (ROOT / path).read_text()
    return [b for b in re.split(r"\n(?=[A-Za-z0-9])", text) if re.match(r"[A-Za-z0-9]", b)]


def test_every_locked_requirement_carries_hashes():
    for path in ("requirements.txt", "requirements-dev.txt"):
        entries = blocks(path)
        assert entries, path
        for entry in entries:
            assert "==" in entry.split()[0] and "--hash=sha256:" in entry, f"{path}: {entry.splitlines()[0]}"


def test_the_runtime_lock_holds_every_direct_pin_and_no_test_tool():
    direct = pins("requirements.in")
    locked = pins("requirements.txt")
    assert {"django", "django-rest-knox", "django-axes", "django-csp"} <= set(direct)
    for lines in (ROOT / "requirements.in").read_text().splitlines():
        if lines.strip() and not lines.startswith("#"):
            assert "==" in lines, f"requirements.in must pin: {lines}"
    for name, version in direct.items():
        assert locked.get(name) == version, name
    assert not TEST_TOOLS & set(locked)
    assert TEST_TOOLS <= set(pins("requirements-dev.in")) and TEST_TOOLS <= set(pins("requirements-dev.txt"))
    dev = pins("requirements-dev.txt")
    assert all(
        locked[name] == version for name, version in dev.items() if name in locked
    )  # constrained by the runtime lock
