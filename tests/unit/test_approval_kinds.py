"""The re-run grant kinds are one set: the domain's (runs.domain.pipeline),
which approvals.models re-exports next to the kind names."""

from approvals.models import INTERRUPTED_SIDE_EFFECT, RECONCILE, RERUN_KINDS, UNCERTAIN_SIDE_EFFECT
from runs.domain import pipeline


def test_the_rerun_kinds_are_the_domains_set_and_name_the_three_grant_kinds():
    assert RERUN_KINDS is pipeline.RERUN_KINDS
    assert RERUN_KINDS == {INTERRUPTED_SIDE_EFFECT, UNCERTAIN_SIDE_EFFECT, RECONCILE}
