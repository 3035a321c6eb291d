"""The systemd units in deploy/systemd stop as `make run` and `make cluster`
do: SIGTERM to the main process only (KillMode=mixed: a qcluster's sentinel
then drains its workers in order; SIGTERM to every process at once would
leave it waiting), whatever is left of the unit's processes SIGKILLed when
the stop ends (nothing survives: no orphan worker, MCP server or daphne), and
a stop timeout no shorter than the drain the process needs — for a worker,
the longest step it may be in (a model call, AGENTRT_MAX_CALL_SECONDS) plus
the supervisor's own drain grace."""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest

from ops.supervise import STOP_GRACE_SECONDS

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
LONG_RUNNING = ("agentrt-web@.service", "agentrt-worker@.service", "agentrt-maintenance.service")
MAX_CALL_SECONDS_DEFAULT = 300  # agentrt_site/settings.py's AGENTRT_MAX_CALL_SECONDS default


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False, comment_prefixes=("#", ";"))
    parser.optionxform = str  # systemd's keys are case-sensitive
    parser.read_string((UNITS / name).read_text())
    return parser


def seconds(value: str) -> float:
    value = value.strip()
    for suffix, factor in (("min", 60), ("ms", 0.001), ("s", 1), ("m", 60)):
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * factor
    return float(value)


def test_the_default_max_call_seconds_is_the_one_the_units_are_sized_for(settings):
    assert settings.AGENTRT_MAX_CALL_SECONDS == MAX_CALL_SECONDS_DEFAULT


@pytest.mark.parametrize("name", LONG_RUNNING)
def test_each_long_running_unit_stops_its_main_process_first_and_leaves_nothing(name):
    service = unit(name)["Service"]
    assert service.get("KillMode") == "mixed", name
    assert service.get("KillSignal", "SIGTERM") == "SIGTERM", name
    assert service.get("SendSIGKILL", "yes") == "yes", name  # what is left after the stop is killed
    assert service.get("Restart") == "always", name
    assert unit(name)["Unit"].get("PartOf") == "agentrt.target", name  # stopping the target stops it


def test_a_worker_unit_waits_for_the_longest_step_and_the_drain():
    timeout = seconds(unit("agentrt-worker@.service")["Service"]["TimeoutStopSec"])
    assert timeout >= MAX_CALL_SECONDS_DEFAULT + STOP_GRACE_SECONDS, timeout


@pytest.mark.parametrize("name", ("agentrt-web@.service", "agentrt-maintenance.service"))
def test_web_and_maintenance_units_are_stopped_within_the_supervisors_grace(name):
    """They hold no run: each exits on its SIGTERM at once; the unit waits no longer than make run would."""
    timeout = seconds(unit(name)["Service"]["TimeoutStopSec"])
    assert 10 <= timeout <= STOP_GRACE_SECONDS, (name, timeout)


def test_the_target_wants_every_long_running_unit():
    wants = unit("agentrt.target")["Unit"]["Wants"].split()
    for name in LONG_RUNNING:
        stem = name.split("@")[0].removesuffix(".service")
        assert any(w.startswith(stem) for w in wants), (name, wants)
