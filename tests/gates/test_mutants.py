"""Every curated mutant (tests/mutants/*.toml) still applies to the code and
names guard files that exist, so a refactor that moves a mutated snippet
fails here, in `make test`, and not only in `make mutants`."""

from __future__ import annotations

import pytest

from tests.mutants.run import ROOT, load, mutated

MUTANTS = load()


def test_there_are_mutants_for_the_headline_claims():
    names = {m.name for m in MUTANTS}
    assert {
        "fence_dropped_from_step_update",
        "watermark_skipped",
        "lease_never_renewed",
        "ws_origin_validator_removed",
        "approval_hash_not_compared",
        "finalize_keeps_the_lease",
        "csp_header_removed",
        "uncertain_outcome_as_failure",
        "tenant_scope_dropped_from_runs_list",
    } <= names


@pytest.mark.parametrize("mutant", [m for m in MUTANTS if not m.pending], ids=lambda m: m.name)
def test_each_mutant_applies_and_changes_the_code(mutant):
    texts = mutated(ROOT, mutant)
    assert texts
    for path, text in texts.items():
        assert text != path.read_text()
