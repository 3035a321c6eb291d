"""The README quotes the committed soak report (tests/chaos/LAST_SOAK.md):
its headline figures and the command that regenerates it must be the
report's own, so the README cannot claim a soak that was not run. And the
report is re-derived here, figure for figure, from the committed artifact
bundle (tests/chaos/last_soak.tar.xz) by today's checker."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.chaos.report import HEADLINE_RE, parse_headline
from tests.conftest import ROOT

REPORT = ROOT / "tests" / "chaos" / "LAST_SOAK.md"
BUNDLE = ROOT / "tests" / "chaos" / "last_soak.tar.xz"
FINDINGS = ROOT / "tests" / "chaos" / "LAST_SOAK.findings.md"  # written by hand: what its violations are
README = ROOT / "README.md"
RUN_ONLY = {"--out", "--report", "--bundle"}  # where a run writes its artifacts, not what it does


def soak_command(text: str) -> list[str]:
    """The soak command a text quotes (in backticks or on an indented line)."""
    m = re.search(r"(?:`|^ {4})(?:\.venv/bin/)?python -m tests\.chaos\.soak ([^`\n]+)", text, re.M)
    assert m, "no `python -m tests.chaos.soak ...` command quoted"
    argv = shlex.split(m.group(1).split("#")[0])
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in RUN_ONLY:
            skip = True
        else:
            out.append(a)
    return out


EVIDENCE = ROOT / "docs" / "evidence.md"


def readme_soak_section(path: Path = README) -> str:
    text = path.read_text()
    start = text.index("<!-- soak-figures -->")
    end = text.index("<!-- /soak-figures -->")
    return text[start:end]


@pytest.mark.parametrize("path", [README, EVIDENCE], ids=["README.md", "docs/evidence.md"])
def test_readme_quotes_the_committed_soak_reports_figures(path):
    report = parse_headline(REPORT.read_text())
    quoted = parse_headline(readme_soak_section(path))
    assert report is not None, "the committed report has no headline"
    assert quoted is not None, "the README's soak section quotes no headline"
    assert quoted == report


@pytest.mark.parametrize("path", [README, EVIDENCE], ids=["README.md", "docs/evidence.md"])
def test_readme_quotes_the_command_that_regenerates_the_committed_report(path):
    assert soak_command(readme_soak_section(path)) == soak_command(REPORT.read_text())


def test_the_committed_report_has_at_least_10000_process_deaths_of_every_type_and_one_restart_each():
    text = REPORT.read_text()
    figures = parse_headline(text)
    assert figures is not None, "the committed report has no headline"
    assert figures["deaths"] >= 10000 and figures["restarts"] == 1 and figures["redis"] == 1, figures
    assert "Every process type died at least once: True" in text
    verdict = (
        "## Verdict: PASS" if figures["violations"] == 0 else f"## Verdict: FAIL — {figures['violations']} violation(s)"
    )
    assert verdict in text  # the headline's count is the verdict's


def test_the_committed_report_is_the_one_its_committed_bundle_rederives():
    """`python -m tests.chaos.report --from tests/chaos/last_soak.tar.xz --findings
    tests/chaos/LAST_SOAK.findings.md --check tests/chaos/LAST_SOAK.md`: every figure of the committed report
    comes out of its committed artifacts, checked again now by today's checker."""
    from tests.chaos.report import from_bundle

    assert BUNDLE.stat().st_size < 5_000_000, "the bundle is meant to stay small"
    report, md = from_bundle(BUNDLE, FINDINGS if FINDINGS.exists() else None)
    assert md == REPORT.read_text(), "LAST_SOAK.md is not what its bundle re-derives (report --from ... --check)"
    assert (parse_headline(md) or {}).get("violations") == len(report["violations"])
    if report["violations"]:  # a soak that failed says why, by hand, under its verdict
        assert FINDINGS.exists() and "## Findings" in md, "violations without findings"


def test_the_headline_parser_reads_what_the_report_writes_and_sees_a_changed_figure():
    from tests.chaos.report import headline

    r = {
        "deaths": {
            "total": 5123,
            "sigkill": 4600,
            "pg_backends_terminated": 522,
            "pg_restarts": 1,
            "redis_restarts": 1,
        },
        "runs": 3000,
        "config": {"seed": 7},
        "violations": [],
    }
    line = headline(r)
    assert parse_headline(line) == {
        "deaths": 5123,
        "sigkill": 4600,
        "backends": 522,
        "restarts": 1,
        "redis": 1,
        "runs": 3000,
        "seed": 7,
        "violations": 0,
    }
    assert parse_headline(line.replace("5,123", "5,124")) != parse_headline(line)
    assert HEADLINE_RE.search("no figures here") is None
