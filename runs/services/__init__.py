"""The runs app's services: plain keyword-only functions, one transaction each.

This package is the Python API (what REST views, the admin, management
commands and a team's own code call); its modules:

- validation: text and pydantic checks that name the field
- tenants: tenant_create, tenant_configure, policy_floor_check, tenant_get, tenant_of
- agents: agent_load
- submit: run_submit, run_get
- waiting: wait_for_run (until a run ends or waits for a person)
- inputs: run_input (text for a run waiting for the user)
- lifecycle: run_cancel, fail_waiting
- scoping: which tenant a user acts in, which runs and approvals they see
- selectors: read models (run and event dicts)
- agent_schema: the agent definition's schema and limits
"""

from runs.domain.values import RunStatus
from runs.services.agents import agent_load
from runs.services.submit import run_get, run_submit
from runs.services.tenants import policy_floor_check, tenant_configure, tenant_create, tenant_get, tenant_of
from runs.services.waiting import RunWaitTimeout, wait_for_run

__all__ = [
    "tenant_create",
    "tenant_configure",
    "policy_floor_check",
    "tenant_get",
    "tenant_of",
    "agent_load",
    "run_submit",
    "run_get",
    "wait_for_run",
    "RunWaitTimeout",
    "RunStatus",
]
