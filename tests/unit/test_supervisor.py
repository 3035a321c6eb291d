"""The real heartbeat `Supervisor` as the pipeline's `LeaseMonitor`: a worker
may start a side effect only while its last successful heartbeat is younger
than lease - interval (the self-fence), and a heartbeat that finds the lease
gone cancels the run as fenced. The clock is a fake; the heartbeat is a
function the test controls (no database)."""

from __future__ import annotations

import threading
from uuid import uuid4

from runs.domain.values import CancelReason
from runs.runtime.queue import Heartbeat
from runs.runtime.supervisor import Supervisor
from tests.conftest import wait_for
from tests.unit.fakes import FakeClock


class Token:
    def __init__(self):
        self.reasons = []

    def cancel(self, reason):
        self.reasons.append(reason)


def test_no_side_effect_may_start_once_the_last_heartbeat_is_older_than_lease_minus_interval():
    clock = FakeClock()
    hung = threading.Event()
    calls = []

    def heartbeat(**kw):  # the database stopped answering: the beat hangs
        calls.append(kw)
        hung.wait(10)
        return Heartbeat(alive=True)

    sup = Supervisor(
        run_id=uuid4(), owner="w", epoch=1, token=Token(), clock=clock, lease_seconds=0.3, heartbeat=heartbeat
    ).start()
    try:
        assert sup.may_start_effect()
        wait_for(lambda: calls, timeout=5, message="the first heartbeat")
        clock.advance(0.3 - 0.1 - 0.01)  # still inside lease - interval
        assert sup.may_start_effect()
        clock.advance(0.02)  # past it, with no successful beat since the claim
        assert not sup.may_start_effect()
    finally:
        hung.set()
        sup.stop()


def test_a_heartbeat_that_finds_the_lease_gone_cancels_as_fenced_and_forbids_effects():
    clock = FakeClock()
    token = Token()
    sup = Supervisor(
        run_id=uuid4(),
        owner="w",
        epoch=1,
        token=token,
        clock=clock,
        lease_seconds=0.3,
        heartbeat=lambda **kw: Heartbeat(alive=False),
    ).start()
    try:
        wait_for(lambda: token.reasons, timeout=5, message="the fenced cancel")
        assert token.reasons == [CancelReason.FENCED]
        wait_for(lambda: not sup._thread.is_alive(), timeout=5, message="the supervisor to stop renewing")
        assert not sup.may_start_effect()  # a dead supervisor renews nothing
    finally:
        sup.stop()
