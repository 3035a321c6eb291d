"""Ids made on the step path are ordered the way rows are inserted (issue 16
item 5): with random ids every step's model call, tool call and checkpoint
rows went to a random leaf of a large table's primary-key index (read from
disk, written to the WAL whole once per checkpoint cycle)."""

from __future__ import annotations

import uuid

from runs.clock import IDS
from runs.store.repository import _checkpoint_id


def test_new_ids_are_uuid7_and_increase_in_the_order_they_are_made():
    ids = [IDS.new_id() for _ in range(5000)]  # many within one millisecond: the counter orders them
    assert {i.version for i in ids} == {7}
    assert all(type(i) is uuid.UUID for i in ids)  # the stdlib type, whatever makes them
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert [str(i) for i in ids] == sorted(str(i) for i in ids)  # PostgreSQL's uuid order is the text's


def test_a_checkpoint_id_is_named_by_run_and_version_and_sits_with_its_runs():
    run = IDS.new_id()
    ids = [_checkpoint_id(run, v) for v in range(1, 401)]
    assert ids == [_checkpoint_id(run, v) for v in range(1, 401)]  # deterministic
    assert len(set(ids)) == 400
    assert {i.version for i in ids} == {8} and {i.variant for i in ids} == {uuid.RFC_4122}
    assert {i.int >> 64 & ~(0xF << 12) for i in ids} == {run.int >> 64 & ~(0xF << 12)}  # the run's first 64 bits
    later = IDS.new_id()
    assert max(ids) < min(_checkpoint_id(later, v) for v in range(1, 401))  # a later run's go after


def test_runs_that_share_their_first_64_bits_still_get_different_checkpoint_ids():
    a = uuid.UUID("01a2325b-6ade-7cff-a1b2-70e9b66b72dd")
    b = uuid.UUID("01a2325b-6ade-7cff-8000-000000000001")
    assert {_checkpoint_id(a, v) for v in range(1, 1001)}.isdisjoint({_checkpoint_id(b, v) for v in range(1, 1001)})
