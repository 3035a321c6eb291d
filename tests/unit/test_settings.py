"""Database timeouts sit below the heartbeat interval, so a dead connection or
a lock wait cannot hang a heartbeat past the lease (RELIABILITY §4)."""

import re
import runpy
from pathlib import Path

import pytest

SETTINGS = Path(__file__).resolve().parents[2] / "agentrt_site" / "settings.py"


@pytest.mark.parametrize("lease", [30, 12, 9])
def test_every_database_timeout_is_shorter_than_the_heartbeat_interval(monkeypatch, lease):
    monkeypatch.setenv("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/x")
    monkeypatch.setenv("AGENTRT_LEASE_SECONDS", str(lease))
    conf = runpy.run_path(str(SETTINGS))
    options = conf["DATABASES"]["default"]["OPTIONS"]
    heartbeat_ms = lease * 1000 / 3
    timeouts = {k: int(v) for k, v in re.findall(r"-c (\w+)=(\d+)", options["options"])}
    assert set(timeouts) == {"statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout"}
    assert all(0 < ms < heartbeat_ms for ms in timeouts.values()), timeouts
    assert max(2, options["connect_timeout"]) * 1000 < heartbeat_ms  # libpq treats anything under 2 s as 2 s
    assert options["keepalives"] == 1 and options["keepalives_idle"] * 1000 < lease * 1000
