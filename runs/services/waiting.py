"""`wait_for_run`: wait, from code in the same Django project (a Celery task,
a view, a management command), until a run submitted with `run_submit`
settles.

    run, _ = run_submit(tenant=tenant, agent="cashier", input="charge cus_42 12.50 EUR")
    run = wait_for_run(run.id, timeout=120)
    if run.status == "COMPLETED": ...

A run settles when it ends (COMPLETED, FAILED, CANCELLED) or, unless
`waiting=False`, when it waits for a person (WAITING_FOR_APPROVAL,
WAITING_FOR_USER): nothing more happens until someone answers. The run is
read again with backoff (50 ms growing to 1 s); nothing is held meanwhile.
Call it outside any transaction: a run created in the caller's open
transaction cannot start until that commits.
"""

from __future__ import annotations

import time
from typing import Any
from uuid import UUID

from django.db import connection

from runs.clock import CLOCK
from runs.domain.values import TERMINAL_STATUSES, WAITING_STATUSES
from runs.errors import RunNotFound, RunWaitTimeout
from runs.models import Run


def wait_for_run(run_id: UUID | str | Any, timeout: float, *, waiting: bool = True, poll_max: float = 1.0) -> Run:
    """Return the run once it settles; raise `RunWaitTimeout` after `timeout` seconds."""
    if connection.in_atomic_block:
        raise RuntimeError("wait_for_run inside a transaction: the run cannot start until the transaction commits")
    try:
        rid = UUID(str(getattr(run_id, "id", run_id)))
    except ValueError:
        raise RunNotFound("no such run") from None
    settled = {s.value for s in TERMINAL_STATUSES} | ({s.value for s in WAITING_STATUSES} if waiting else set())
    deadline = CLOCK.monotonic() + max(0.0, float(timeout))
    delay = 0.05
    while True:
        run = Run.objects.filter(id=rid).first()
        if run is None:
            raise RunNotFound("no such run")
        if run.status in settled:
            return run
        left = deadline - CLOCK.monotonic()
        if left <= 0:
            raise RunWaitTimeout(f"the run is still {run.status} after {float(timeout):g} s")
        time.sleep(min(delay, left))
        delay = min(poll_max, delay * 2)
