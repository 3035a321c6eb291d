"""The alert rules in deploy/prometheus are valid, fire on the series they are for, and read only metrics that
/metrics exposes. `promtool` comes with Debian's `prometheus` package, which `make test` installs when it is
missing (as it does chromium and nginx); without it this module fails, it never skips."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.django_db

RULES = ROOT / "deploy" / "prometheus" / "agentrt.rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "agentrt.rules.test.yml"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def promtool(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=cwd or RULES.parent, capture_output=True, text=True, timeout=60)


def test_promtool_accepts_the_rules_and_their_unit_tests_pass():
    checked = promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 6 rules found" in checked.stdout
    tested = promtool("test", "rules", RULE_TESTS.name)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_promtool_refuses_a_broken_rule(tmp_path):
    """Not vacuous: a rule with a broken expression and one whose unit test expects the wrong alert both fail."""
    (tmp_path / "bad.yml").write_text(
        "groups:\n  - name: x\n    rules:\n      - alert: Broken\n        expr: max(agent_queue_depth > \n"
    )
    assert promtool("check", "rules", "bad.yml", cwd=tmp_path).returncode != 0
    shutil.copy(RULES, tmp_path / RULES.name)
    wrong = RULE_TESTS.read_text().replace(
        "alertname: AgentrtQueueBackingUp\n        exp_alerts: []",
        "alertname: AgentrtQueueBackingUp\n        exp_alerts: [{exp_labels: {severity: page}}]",
        1,
    )
    (tmp_path / "wrong.test.yml").write_text(wrong)
    assert promtool("test", "rules", "wrong.test.yml", cwd=tmp_path).returncode != 0


def test_every_metric_a_rule_reads_is_one_metrics_exposes_from_the_first_scrape(client, settings):
    settings.AGENTRT_METRICS_TOKEN = ""
    body = client.get("/metrics").content.decode()
    exposed = set(re.findall(r"^([a-z_:][a-z0-9_:]*)(?:\{|\s)", body, re.M))
    exposed |= {re.sub(r"_(bucket|sum|count)$", "", name) for name in exposed}  # a histogram by its own name
    read = set(re.findall(r"\b(agent_[a-z0-9_]+)\b", RULES.read_text()))

    assert read and read <= exposed, f"rules read metrics /metrics does not expose: {sorted(read - exposed)}"
