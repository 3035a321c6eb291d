"""The run queue: claim a QUEUED run under a new lease epoch, and heartbeat.

Lease expiry is database time (`now() + lease` in SQL on PostgreSQL). The
lease is released only by `finalize` (runs/runtime/executor.py). The
statements are in runs/store/lease.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from django.conf import settings

from runs.store import lease


@dataclass(frozen=True)
class Claim:
    run_id: UUID
    tenant_id: UUID
    session_id: UUID
    owner: str
    epoch: int


@dataclass(frozen=True)
class Heartbeat:
    alive: bool
    cancel_requested: bool = False
    deadline_passed: bool = False


def _lease_seconds() -> float:
    return float(settings.AGENTRT_LEASE_SECONDS)


def _claim(leased: lease.Leased | None, owner: str) -> Claim | None:
    if leased is None:
        return None
    return Claim(
        run_id=leased.run_id,
        tenant_id=leased.tenant_id,
        session_id=leased.session_id,
        owner=owner,
        epoch=leased.epoch,
    )


def run_claim(*, run_id: UUID, owner: str) -> Claim | None:
    """One guarded UPDATE on a QUEUED run, and `run.claimed` in the same
    transaction; None when the run was not QUEUED (a duplicate doorbell)."""
    return _claim(lease.claim(run_id=run_id, owner=owner, lease_seconds=_lease_seconds()), owner)


def run_claim_next(*, owner: str) -> Claim | None:
    """Claim the next runnable run (FOR UPDATE SKIP LOCKED on PostgreSQL)."""
    return _claim(lease.claim(run_id=None, owner=owner, lease_seconds=_lease_seconds()), owner)


def run_heartbeat(*, run_id: UUID, owner: str, epoch: int) -> Heartbeat:
    """Extend our lease; `alive` is False when the lease is no longer ours.
    The same query reports a cancel request and a passed deadline."""
    beat = lease.renew(run_id=run_id, owner=owner, epoch=epoch, lease_seconds=_lease_seconds())
    if beat is None:
        return Heartbeat(alive=False)
    return Heartbeat(alive=True, cancel_requested=beat.cancel_requested, deadline_passed=beat.deadline_passed)


def db_now() -> datetime:
    """The database's clock (PostgreSQL) or the host's (SQLite, same machine)."""
    return lease.db_now()
