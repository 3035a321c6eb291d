"""One scoping module (issue 12 item 5): no surface (REST, pages, admin,
sockets) filters by tenant itself. The gate runs over the surfaces and must
find nothing, and over its planted fixture and must find exactly the
planted lines."""

from __future__ import annotations

from pathlib import Path

from tests.gates.structure import ROOT
from tests.gates.tenancy import surface_files, tenant_filter_violations

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "vocab"  # beside test_structure.py's own fixtures


def test_no_surface_filters_by_tenant_itself():
    files = surface_files()
    assert {f.relative_to(ROOT).as_posix() for f in files} >= {
        "runs/web/consumers.py",
        "runs/web/views.py",
        "runs/api/views.py",
        "runs/admin.py",
        "approvals/admin.py",
    }
    violations = tenant_filter_violations(files)
    assert not violations, "\n".join(str(v) for v in violations)


def test_the_gate_catches_each_planted_tenant_filter():
    fixture = FIXTURES / "planted_tenant_filters.py"
    lines = fixture.read_text(encoding="utf-8").splitlines()
    planted = {n for n, line in enumerate(lines, start=1) if line.rstrip().endswith("# planted")}
    assert {v.line for v in tenant_filter_violations([fixture], root=ROOT)} == planted
