"""Every `AGENTRT_*` environment variable the settings module reads (its name quoted, as `env_int("AGENTRT_…")`
and `os.environ.get("AGENTRT_…")` take it) is documented somewhere in docs/ (most on the settings page, some
beside the feature they tune): a setting added without a line of documentation fails here."""

from __future__ import annotations

import re

from tests.gates.structure import ROOT

NAME = re.compile(r"\bAGENTRT_[A-Z0-9_]+\b")
READ = re.compile(r"[\"'](AGENTRT_[A-Z0-9_]+)[\"']")  # a name read from the environment is a string literal


def undocumented(settings_text: str, docs_text: str) -> list[str]:
    return sorted(set(READ.findall(settings_text)) - set(NAME.findall(docs_text)))


def docs_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md")))


def test_every_setting_the_settings_module_reads_is_documented():
    names = set(READ.findall((ROOT / "agentrt_site" / "settings.py").read_text(encoding="utf-8")))
    assert len(names) > 60  # the whole module, not a corner of it

    missing = undocumented((ROOT / "agentrt_site" / "settings.py").read_text(encoding="utf-8"), docs_text())

    assert missing == [], f"document these in docs/settings.md: {missing}"


def test_the_check_names_a_setting_the_docs_do_not_mention():
    planted = (
        'AGENTRT_LEASE_SECONDS = env_float("AGENTRT_LEASE_SECONDS", 30)\nX = os.environ.get("AGENTRT_NOT_A_THING")'
    )
    assert undocumented(planted, docs_text()) == ["AGENTRT_NOT_A_THING"]
