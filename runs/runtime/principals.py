"""Who a run acts for (`principal_for`: resolved once per execution).

`principal_for` resolves the principal once per execution from the stamp
`run_submit` left on the run (the user and its scope set then): a worker
holds no credential and never re-derives the set. `Revalidation` is the
`PrincipalCheck` port: at resumption after an approval or input the loop
asks whether the user may still act for the run — it must still exist, be
active and be a member of the run's tenant.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model

from runs.domain.values import Principal
from runs.models import Membership, Run


def principal_for(run: Run, *, username: str | None) -> Principal:
    """`username`: the principal's, read with the run (`claimed_run`); None when that user is gone."""
    scopes = frozenset(run.principal_scopes or [])
    if run.principal_user_id is None:
        return Principal(kind="system", tenant_id=run.tenant_id, scopes=scopes)
    return Principal(
        kind="user", tenant_id=run.tenant_id, user_id=run.principal_user_id, username=username, scopes=scopes
    )


class Revalidation:
    """`PrincipalCheck` over the user and membership tables (one query while all is well)."""

    def revoked(self, principal: Principal) -> str | None:
        if not principal.is_user:
            return None  # the system: nothing to revoke
        member = (
            Membership.objects.filter(user_id=principal.user_id, tenant_id=principal.tenant_id)
            .values_list("user__is_active", flat=True)
            .first()
        )
        if member is None:
            if not get_user_model().objects.filter(pk=principal.user_id).exists():
                return "the user no longer exists"
            return "the user was removed from the run's tenant"
        if not member:
            return "the user was deactivated"
        return None
