"""The seed-coverage gate (issue 15): docs/seed-coverage.md's "Seed 002 coverage"
table names a row with a real test for every line of seed 002's milestone
table, and everything it names exists. It runs over the real table and must
find nothing, and over doctored copies of it and must find each planted fault.
No database, nothing imported from the files it names."""

from __future__ import annotations

import pytest

from tests.gates.seed_coverage import (
    COLUMNS,
    SEED_MILESTONES,
    Finding,
    check,
    seed_milestones,
    table_rows,
)
from tests.gates.structure import ROOT

TABLE = (ROOT / "docs" / "seed-coverage.md").read_text(encoding="utf-8")


def report(findings: list[Finding]) -> str:
    return "\n".join(str(f) for f in findings)


# -- the real table and the seed ----------------------------------------------------


def test_the_table_covers_every_seed_line_and_everything_it_names_exists():
    findings = check(TABLE)
    assert findings == [], report(findings)


def test_the_table_has_a_row_for_each_seed_line_in_milestone_order():
    rows, findings = table_rows(TABLE)
    assert findings == []
    seen = [r.cell("seed line") for r in rows if r.cell("seed line") != "—"]
    assert list(dict.fromkeys(seen)) == [capability for capability, _ in SEED_MILESTONES]
    assert [r.cell("milestone") for r in rows if r.cell("milestone") != "—"] == sorted(
        (r.cell("milestone") for r in rows if r.cell("milestone") != "—"), key=lambda m: int(m[1:])
    )


def test_the_seed_parser_reads_the_table_under_milestones_and_stops_after_it():
    text = "\n".join(
        [
            "Clock, IdFactory M1",  # before the section: not the table
            "Milestones¶",
            "Some prose.",
            "# capability milestone",
            "Step, run_loop M1",
            "cancel endpoint, points 4-6, sandbox M5",
            "Cancellation is split rather than assigned to one milestone, which",
        ]
    )
    assert seed_milestones(text) == [("Step, run_loop", "M1"), ("cancel endpoint, points 4-6, sandbox", "M5")]
    with pytest.raises(ValueError, match="Milestones"):
        seed_milestones("no such section")
    with pytest.raises(ValueError, match="capability milestone"):
        seed_milestones("Milestones¶\nprose only")


# -- planted faults: doctored copies of the real table --------------------------------


def doctored(old: str, new: str, text: str = TABLE) -> str:
    assert text.count(old) == 1, f"the doctoring needs exactly one {old!r} in the table"
    return text.replace(old, new)


def without_rows(seed_line: str, text: str = TABLE) -> str:
    kept = [line for line in text.splitlines() if not line.startswith(f"| M4 | {seed_line} |")]
    assert len(kept) < len(text.splitlines())
    return "\n".join(kept)


def moved_first_m7_row_to_the_top(text: str = TABLE) -> str:
    lines = text.splitlines()
    m7 = next(i for i, line in enumerate(lines) if line.startswith("| M7 |"))
    m1 = next(i for i, line in enumerate(lines) if line.startswith("| M1 |"))
    row = lines.pop(m7)
    lines.insert(m1, row)
    return "\n".join(lines)


NO_IDENTITY = ("test_execution.py::test_every_step_has_a_persisted_identity`", "test_execution.py::test_no_identity`")
DAMAGED = "`tests/integration/test_guards.py::test_a_damaged_approval_row_fails_the_run_at_resume_without_rewriting_it`"


# plant -> (the doctored table, the findings it must give: kind and a part of the message)
def moved_first_beyond_row_before_the_last_seed_row(text: str = TABLE) -> str:
    lines = text.splitlines()
    beyond = next(i for i, line in enumerate(lines) if line.startswith("| — | — |"))
    row = lines.pop(beyond)
    last_seed = max(i for i, line in enumerate(lines) if line.startswith("| M"))
    lines.insert(last_seed, row)
    return "\n".join(lines)


PLANTED = {
    "a test that does not exist": (
        lambda: doctored(*NO_IDENTITY),
        [("test", "tests/integration/test_execution.py defines no test test_no_identity")],
    ),
    "a test file that does not exist": (
        lambda: doctored(
            "`tests/e2e/test_qcluster.py::test_the_heartbeat", "`tests/e2e/test_cluster.py::test_the_heartbeat"
        ),
        [("test_file", "tests/e2e/test_cluster.py is not a test file")],
    ),
    "a module that does not exist": (
        lambda: doctored("`runs/domain/cancellation.py`", "`runs/domain/cancel_token.py`"),
        [("path", "runs/domain/cancel_token.py does not exist")],
    ),
    "a function the module does not define": (
        lambda: doctored("(`sweep_prune`)", "(`sweep_checkpoints`)"),
        [("name", "maintenance/sweeps/prune.py defines no sweep_checkpoints")],
    ),
    "a method the class does not have": (
        lambda: doctored("`Ledger.record_child_usage`", "`Ledger.record_grandchild_usage`"),
        [("name", "runs/domain/budgets.py defines no Ledger.record_grandchild_usage")],
    ),
    "a mutant that does not exist": (
        lambda: doctored("mutant `claim_not_guarded`", "mutant `claim_not_checked`"),
        [("mutant", "no tests/mutants/claim_not_checked.toml")],
    ),
    "a capability with no row": (
        lambda: without_rows("cancellation of a waiting run"),
        [("capability", "'cancellation of a waiting run' has no row naming a test")],
    ),
    "a row under the wrong milestone": (
        lambda: TABLE.replace("| M4 | cancellation of a waiting run |", "| M5 | cancellation of a waiting run |", 1),
        [("milestone", "'cancellation of a waiting run' is M4 in the seed, not M5")],
    ),
    "a row out of the seed's order": (
        moved_first_m7_row_to_the_top,
        [("order", "'Step, run_loop, RunExecutor, finalize' comes after 'build_with_pressure, Compactor, cap 2'")],
    ),
    "a row beyond the seed's table given a milestone": (
        lambda: doctored("| — | — | tool-loop breaker", "| M7 | — | tool-loop breaker"),
        [("milestone", "a row beyond the seed's table has milestone M7, not —")],
    ),
    "a seed row after a row beyond the seed's table": (
        moved_first_beyond_row_before_the_last_seed_row,
        [("order", "'apply_runtime_carry' comes after a row beyond the seed's table")],
    ),
    "a row that names no test": (
        lambda: doctored(f"| {DAMAGED} |", "| — |"),
        [("no_test", "names no test (pytest node id) and does not say 'not built'")],
    ),
    "a seed line the seed does not have": (
        lambda: doctored("| M1 | Clock, IdFactory |", "| M1 | Clock, IdFactory, Calendar |"),
        [
            ("seed_line", "'Clock, IdFactory, Calendar' is not a line of the seed's milestone table"),
            ("capability", "'Clock, IdFactory' has no row naming a test"),  # it was the line's only row
        ],
    ),
}


@pytest.mark.parametrize("plant", sorted(PLANTED))
def test_the_checker_reports_each_planted_fault_and_nothing_else(plant):
    make, expected = PLANTED[plant]
    findings = check(make())
    assert len(findings) == len(expected), report(findings)
    for finding, (kind, message) in zip(findings, expected, strict=True):
        assert finding.kind == kind and message in finding.message, report(findings)


def test_one_doctored_copy_with_a_missing_test_module_and_capability_reports_all_three():
    text = without_rows("cancellation of a waiting run")
    text = doctored("`runs/domain/cancellation.py`", "`runs/domain/cancel_token.py`", text)
    text = doctored(*NO_IDENTITY, text=text)
    kinds = sorted(f.kind for f in check(text))
    assert kinds == ["capability", "path", "test"], report(check(text))


def test_a_capability_added_to_the_seed_is_reported_missing():
    seed = list(SEED_MILESTONES) + [("projection catch-up, replay", "M8")]
    assert [str(f) for f in check(TABLE, seed=seed)] == [
        "docs/seed-coverage.md:0: [capability] 'projection catch-up, replay' has no row naming a test"
    ]


def test_a_table_without_its_columns_or_section_is_reported():
    assert [f.kind for f in check(doctored("| milestone | seed line | ours |", "| milestone | seed | ours |"))] == [
        "table"
    ]
    assert [f.kind for f in check(TABLE.replace("## Seed 002 coverage", "## Coverage"))] == ["table"]
    assert COLUMNS == ("milestone", "seed line", "ours", "module", "test")
