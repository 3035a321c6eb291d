"""Structural gates (seed 002): each runs over the runtime code and must find
nothing, and over its planted fixture and must find exactly the planted lines."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from tests.gates.structure import (
    ERROR_EXCEPTIONS,
    ROOT,
    WRITERS,
    ambient_identity_violations,
    ambient_time_violations,
    atomic_blocks,
    domain_files,
    domain_import_violations,
    error_home_violations,
    exception_classes,
    rel,
    runtime_files,
    sql_writes,
    terminal_writer_violations,
    terminal_writes,
    transaction_io_violations,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures"
RUNTIME = runtime_files()


def planted_lines(path: Path) -> set[int]:
    lines = path.read_text(encoding="utf-8").splitlines()
    marked = {n for n, line in enumerate(lines, start=1) if line.rstrip().endswith("# planted")}
    assert marked, f"{path.name} plants nothing"
    return marked


def report(violations) -> str:
    return "\n".join(str(v) for v in violations)


def assert_catches_exactly_the_planted_lines(violations, fixture: Path):
    expected = planted_lines(fixture)
    found = {v.line for v in violations}
    assert all(v.path == rel(fixture) for v in violations), report(violations)
    assert found - expected == set(), "reported lines that plant nothing:\n" + report(
        v for v in violations if v.line not in expected
    )
    assert expected - found == set(), f"missed planted lines {sorted(expected - found)}"


# -- the runtime code -------------------------------------------------------------


def test_runtime_code_is_every_module_of_the_runtime_packages_but_migrations():
    names = {rel(p) for p in RUNTIME}

    assert {
        "runs/runtime/executor.py",
        "runs/runtime/queue.py",
        "runs/store/repository.py",
        "runs/domain/loop.py",
        "approvals/policy.py",
        "checkpoints/repository.py",
        "runs/management/commands/submit_run.py",
    } <= names
    assert any(n.startswith("maintenance/") for n in names)
    assert not any("/migrations/" in n for n in names)
    assert all(n.endswith(".py") for n in names)


def test_only_the_writer_table_writes_run_status_and_lease_columns():
    violations = terminal_writer_violations(RUNTIME)

    assert violations == [], report(violations)


def test_the_writer_gate_sees_the_writes_the_writers_make():
    """Not vacuous: every function of the writer table writes what it is
    listed for, and nothing else writes: not the step's fence (its
    `status = 'RUNNING'` is a guard), not the statement-by-statement path,
    whose other status writes are other tables'."""
    columns = defaultdict(set)
    for write in terminal_writes(RUNTIME):
        columns[write.where].add(write.column)

    assert dict(columns) == {where: set(allowed) for where, allowed in WRITERS.items()}
    assert columns["runs/runtime/finalize.py::_transition"] == {"status", "lease_owner", "lease_expires_at"}
    assert not any(where.startswith("runs/store/repository.py") for where in columns)


def test_a_status_write_in_another_function_of_the_executor_fails_the_gate(tmp_path):
    """The escape of a per-file gate: finalize.py is a writer, but only its
    `_transition`; the same write from a new function of the real module is
    a violation."""
    source = (ROOT / "runs/runtime/finalize.py").read_text(encoding="utf-8")
    planted = source + (
        "\n\ndef _quietly_fail(run_id):\n"
        '    Run.objects.filter(id=run_id).update(status="FAILED")\n'
        '    return Transition(status="FAILED", release_lease=True)\n'
    )
    module = tmp_path / "runs" / "runtime" / "finalize.py"
    module.parent.mkdir(parents=True)
    module.write_text(planted, encoding="utf-8")
    lines = len(planted.splitlines())

    violations = terminal_writer_violations([module], root=tmp_path)

    assert sorted((v.line, v.message.split(" in ")[0]) for v in violations) == [
        (lines - 1, "writes runs.status (orm)"),
        (lines, "writes runs.lease_expires_at (typed)"),
        (lines, "writes runs.lease_owner (typed)"),
        (lines, "writes runs.status (typed)"),
    ]
    assert all("_quietly_fail" in v.message for v in violations)
    assert terminal_writer_violations([ROOT / "runs/runtime/finalize.py"]) == []


def test_no_ambient_time_outside_the_clock_adapter():
    violations = ambient_time_violations(RUNTIME)

    assert violations == [], report(violations)


def test_no_ambient_identity_outside_the_id_adapter():
    violations = ambient_identity_violations(RUNTIME)

    assert violations == [], report(violations)


def test_the_clock_adapter_is_the_one_exemption_and_it_is_seen():
    clock = [p for p in RUNTIME if rel(p) == "runs/clock.py"]

    time_reads = ambient_time_violations(clock, exempt=frozenset())
    id_reads = ambient_identity_violations(clock, exempt=frozenset())

    assert {v.message.split()[1].rstrip(";") for v in time_reads} == {"datetime.datetime.now", "time.monotonic"}
    assert [v.message.split()[1].rstrip(";") for v in id_reads] == ["uuid6.uuid7"]


def test_the_domain_core_imports_only_stdlib_pydantic_and_itself():
    files = domain_files(RUNTIME)

    assert {"runs/domain/loop.py", "runs/domain/pipeline/execute.py", "runs/domain/values.py"} <= {
        rel(p) for p in files
    }
    violations = domain_import_violations(files)
    assert violations == [], report(violations)


def test_no_external_io_inside_a_transaction():
    violations = transaction_io_violations(RUNTIME)

    assert violations == [], report(violations)
    assert {path for path, _ in atomic_blocks(RUNTIME)} >= {
        "runs/store/repository.py",
        "runs/store/lease.py",
        "runs/services/lifecycle.py",
        "approvals/services.py",
    }


def test_exception_classes_of_runs_live_in_their_errors_modules():
    files = [p for p in RUNTIME if rel(p).startswith("runs/")]

    violations = error_home_violations(files)

    assert violations == [], report(violations)
    found = {(path, name) for path, _, name in exception_classes(files)}
    assert {("runs/errors.py", "RunNotWaitingForUser"), ("runs/domain/errors.py", "WorkerFenced")} <= found


# -- the planted violations ----------------------------------------------------------


def test_writer_gate_catches_the_planted_writes():
    fixture = FIXTURES / "planted_terminal_writer.py"

    violations = terminal_writer_violations([fixture])

    assert_catches_exactly_the_planted_lines(violations, fixture)
    source = fixture.read_text().splitlines()
    orm = [v for v in violations if 'update(status="FAILED")' in source[v.line - 1]]
    sql = [v for v in violations if "UPDATE runs SET status = 'FAILED' WHERE id = %s" in source[v.line - 1]]
    assert [v.message for v in orm] == ["writes runs.status (orm) in fail_run; only the writer table of DESIGN §4 may"]
    assert [v.message for v in sql] == ["writes runs.status (sql) in fail_run; only the writer table of DESIGN §4 may"]


def test_writer_gate_allows_only_the_columns_of_each_writer():
    fixture = FIXTURES / "planted_terminal_writer.py"
    status_only = {
        f"{rel(fixture)}::{function}": frozenset({"status"})
        for function in ("fail_run", "more_ways", "guards_and_other_tables", "invocation_sets", "run_sets")
    }

    violations = terminal_writer_violations([fixture], writers=status_only)

    assert violations, "the lease writes are still violations for a status-only writer"
    assert {v.message.split()[1] for v in violations if v.message.startswith("writes")} == {
        "runs.lease_owner",
        "runs.lease_epoch",
        "runs.lease_expires_at",
    }
    assert [v.message.split(":")[0] for v in violations if not v.message.startswith("writes")] == ["unanalysable"], (
        "an unanalysable write is reported even in a listed writer"
    )


def test_writer_gate_is_keyed_by_function_and_reads_typed_transitions():
    fixture = FIXTURES / "planted_writer_functions.py"
    only_transition = {f"{rel(fixture)}::_transition": frozenset({"status", "lease_owner", "lease_expires_at"})}

    violations = terminal_writer_violations([fixture], writers=only_transition)

    assert_catches_exactly_the_planted_lines(violations, fixture)
    source = fixture.read_text().splitlines()
    keep = [v for v in violations if "release_lease=False" in source[v.line - 1]]
    assert [v.message.split(" in ")[0] for v in keep] == ["writes runs.status (typed)"]
    assert any("Finisher.finish" in v.message for v in violations)


def test_writer_gate_reports_writes_it_cannot_read():
    fixture = FIXTURES / "planted_unanalysable_writes.py"
    everything = {
        f"{rel(fixture)}::{function}": frozenset({"status", "lease_owner", "lease_epoch", "lease_expires_at"})
        for function in ("dynamic", "readable")
    }

    violations = terminal_writer_violations([fixture], writers=everything)

    assert_catches_exactly_the_planted_lines(violations, fixture)
    assert all(v.message.startswith("unanalysable") for v in violations), report(violations)


def test_every_listed_error_exception_still_exists():
    """The list of exceptions to the error gate cannot rot: each entry names a
    class that is still where it says."""
    files = [p for p in RUNTIME if rel(p).startswith("runs/")]
    found = {f"{path}::{name}" for path, _, name in exception_classes(files)}

    assert set(ERROR_EXCEPTIONS) - found == set()


def test_error_gate_catches_the_planted_classes():
    fixture = FIXTURES / "planted_error_homes.py"

    assert_catches_exactly_the_planted_lines(error_home_violations([fixture]), fixture)


def test_ambient_time_gate_catches_the_planted_reads():
    fixture = FIXTURES / "planted_ambient_time.py"

    assert_catches_exactly_the_planted_lines(ambient_time_violations([fixture]), fixture)


def test_ambient_identity_gate_catches_the_planted_ids():
    fixture = FIXTURES / "planted_ambient_identity.py"

    assert_catches_exactly_the_planted_lines(ambient_identity_violations([fixture]), fixture)


def test_domain_gate_catches_the_planted_imports():
    fixture = FIXTURES / "planted_domain_imports.py"

    assert_catches_exactly_the_planted_lines(domain_import_violations([fixture]), fixture)


def test_domain_gate_resolves_relative_imports(tmp_path):
    domain = tmp_path / "runs" / "domain"
    domain.mkdir(parents=True)
    module = domain / "thing.py"
    module.write_text(
        "from .values import RunStatus\n"
        "from . import errors\nfrom ..models import Run\n"
        "from .. import store\nfrom ...django_stuff import x\n"
    )

    violations = domain_import_violations([module], root=tmp_path)

    assert sorted((v.line, v.message) for v in violations) == [
        (3, "the domain core imports 'runs.models'"),
        (4, "the domain core imports 'runs.store'"),
        (5, "the domain core imports 'django_stuff'"),
    ]


def test_transaction_gate_catches_the_planted_io():
    fixture = FIXTURES / "planted_transaction_io.py"

    assert_catches_exactly_the_planted_lines(transaction_io_violations([fixture]), fixture)


def test_planted_fixtures_are_not_collected_as_tests():
    names = sorted(p.name for p in FIXTURES.glob("*.py"))

    assert names == [
        "planted_ambient_identity.py",
        "planted_ambient_time.py",
        "planted_domain_imports.py",
        "planted_error_homes.py",
        "planted_pointers.py",
        "planted_terminal_writer.py",
        "planted_transaction_io.py",
        "planted_unanalysable_writes.py",
        "planted_writer_functions.py",
    ]
    assert not any(n.startswith("test_") or n.endswith("_test.py") for n in names)
    assert ROOT in FIXTURES.parents


# -- the SQL reading of the writer gate ----------------------------------------------


@pytest.mark.parametrize(
    "sql, columns",
    [
        ("UPDATE runs SET status = 'FAILED' WHERE id = %s", ["status"]),
        ("update runs set status = 'x'", ["status"]),
        ('UPDATE "runs" SET "status" = %s WHERE id = %s', ["status"]),
        ("UPDATE runs SET runs.lease_owner = NULL", ["lease_owner"]),
        ("UPDATE runs AS r SET lease_epoch = lease_epoch + 1 WHERE id = %s", ["lease_epoch"]),
        (
            "UPDATE runs SET lease_expires_at = now() + make_interval(secs => %s) WHERE id = %s AND status = 'RUNNING'",
            ["lease_expires_at"],
        ),
        (
            "UPDATE runs SET failure = (SELECT status FROM x WHERE status = 'a'), status = 'FAILED' WHERE id = %s",
            ["status"],
        ),
        (
            "UPDATE runs SET updated_at = now() WHERE id = %s AND lease_owner = %s AND lease_epoch = %s AND"
            " status = 'RUNNING'",
            [],
        ),
        ("UPDATE approvals SET status = 'cancelled' WHERE run_id = %s", []),
        ("UPDATE tool_invocations SET effect_sent_at = %s, status = 'executing', lease_epoch = %s WHERE id = %s", []),
        (
            "status = 'QUEUED', lease_owner = NULL, lease_expires_at = NULL",
            ["status", "lease_owner", "lease_expires_at"],
        ),
        (", lease_epoch = %s", ["lease_epoch"]),
        ("id = %s AND status = 'QUEUED'", []),
        ("SELECT id FROM runs WHERE status = 'QUEUED' AND lease_expires_at <= now()", []),
        ("status >= 'A' OR status != 'B'", []),
    ],
)
def test_sql_writes_counts_assignments_in_the_set_part_of_runs_updates_only(sql, columns):
    found, _, _, unanalysable = sql_writes(sql)

    assert found == columns
    assert not unanalysable


@pytest.mark.parametrize(
    "sql, unanalysable",
    [
        ("UPDATE runs SET {} {} WHERE id = %s AND status = 'QUEUED' RETURNING runs.id", True),
        ("UPDATE runs SET {} WHERE id = %s", True),
        ("UPDATE runs SET updated_at = %s, {} WHERE id = %s", True),
        ("UPDATE runs SET {} = %s WHERE id = %s", True),
        ("WITH f AS (UPDATE runs SET {} WHERE id = %s RETURNING id) SELECT 1", False),  # inside parentheses: blanked
        ("UPDATE runs SET updated_at = {} WHERE id = %s", False),
        ("UPDATE runs SET status = '{}' WHERE id = %s", False),
        ("UPDATE runs SET updated_at = %s WHERE {}", False),
        ("UPDATE tool_invocations SET {} WHERE id = %s", False),
        ("fenced_run AS ({} RETURNING id)", False),
    ],
)
def test_sql_writes_flags_a_hole_where_a_runs_set_list_names_a_column(sql, unanalysable):
    assert sql_writes(sql)[3] is unanalysable
