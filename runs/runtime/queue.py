"""The run queue: claim a QUEUED run under a new lease epoch, and heartbeat.

Lease expiry is database time (`now() + lease` in SQL on PostgreSQL). The
lease is released only by `finalize` (runs/runtime/finalize.py). The
statements are in runs/store/lease.py.

Fair workers: a tenant holds at most AGENTRT_TENANT_MAX_RUNNING leases
(`tenant_share`; 0 = no limit). A claim over its tenant's share leaves the
run QUEUED and its doorbell spent; `ring_for_queued`, which finalize calls
once a run has released its lease, rings the doorbell of that tenant's
next queued run while the tenant has room.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from django.conf import settings

from runs.clock import IDS
from runs.runtime.enqueue import enqueue_drive
from runs.runtime.liveness import LIVENESS
from runs.store import lease


def worker_identity(ids=IDS) -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{ids.new_id().hex[:8]}"


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


def tenant_share() -> int:
    """Leases one tenant may hold at once; 0: no limit."""
    return int(settings.AGENTRT_TENANT_MAX_RUNNING)


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
    transaction; None when the run was not QUEUED (a duplicate doorbell) or
    its tenant holds its share of leases (the run stays QUEUED)."""
    LIVENESS.ensure(owner)  # this process's session holds its lock before it holds a lease
    return _claim(lease.claim(run_id=run_id, owner=owner, lease_seconds=_lease_seconds(), share=tenant_share()), owner)


def run_claim_next(*, owner: str) -> Claim | None:
    """Claim the next runnable run of a tenant under its share (FOR UPDATE
    SKIP LOCKED on PostgreSQL). Workers find their runs by doorbell
    (`run_claim`); nothing in the runtime polls with this."""
    LIVENESS.ensure(owner)
    return _claim(lease.claim(run_id=None, owner=owner, lease_seconds=_lease_seconds(), share=tenant_share()), owner)


def ring_for_queued(*, tenant_id: UUID, released: UUID) -> UUID | None:
    """A run of `tenant_id` has released its lease (committed): ring the
    doorbell of the tenant's next runnable QUEUED run, if the tenant has
    room now. A claim that found the tenant at its share spent that run's
    doorbell; this is its next one. Returns the run rung for, if any. (When
    the run still has a doorbell of its own waiting, one of the two finds
    it leased and does nothing.)"""
    share = tenant_share()
    if share <= 0:
        return None
    run_id = lease.next_for_tenant(tenant_id=tenant_id, released=released, share=share)
    if run_id is not None:
        enqueue_drive(run_id)
    return run_id


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
