"""`CheckpointState`: seed 002's full/delta rule and the materialised chain."""

from __future__ import annotations

from datetime import UTC, datetime

from runs.domain.checkpoint import FULL_EVERY, CheckpointState, is_full

AT = datetime(2025, 1, 1, tzinfo=UTC)


def write_chain(n: int) -> tuple[CheckpointState, list]:
    """Write n checkpoints, one conversation item added before each."""
    state = CheckpointState()
    rows = []
    for i in range(n):
        state.conversation.append({"role": "user", "content": f"m{i}"})
        state.step = i
        rows.append(state.next_checkpoint("seed" if i == 0 else "tool_batch", AT))
    return state, rows


def test_version_one_and_every_eighth_version_after_it_are_full():
    _, rows = write_chain(20)

    assert FULL_EVERY == 8
    assert [r.version for r in rows if r.full] == [1, 9, 17]
    assert [r.version for r in rows] == list(range(1, 21))


def test_compaction_suspension_and_terminal_triggers_are_full():
    for trigger in ("compaction", "suspension", "terminal", "final", "approval_resolved"):
        assert is_full(5, trigger), trigger
    assert not is_full(5, "tool_batch")
    assert not is_full(5, "model_response")
    assert is_full(9, "tool_batch")


def test_deltas_name_their_base_full_version():
    _, rows = write_chain(12)

    bases = {r.version: r.base_version for r in rows}
    assert all(bases[v] == 1 for v in range(2, 9))
    assert all(bases[v] == 9 for v in range(10, 13))
    assert bases[1] is None and bases[9] is None


def test_a_delta_holds_only_the_new_items_and_a_full_row_the_whole_conversation():
    _, rows = write_chain(9)

    assert rows[1].state["items"] == [{"role": "user", "content": "m1"}]
    assert "conversation" not in rows[1].state
    assert [m["content"] for m in rows[8].state["conversation"]] == [f"m{i}" for i in range(9)]


def test_materialise_of_full_plus_deltas_equals_the_in_memory_state():
    state, rows = write_chain(7)
    state.identical_calls["abc"] = 2
    state.conversation.append({"role": "tool", "content": "x"})
    rows.append(state.next_checkpoint("tool_batch", AT))

    rebuilt = CheckpointState.materialise([(r.version, r.full, r.state) for r in rows])

    assert rebuilt is not None
    assert rebuilt.conversation == state.conversation
    assert rebuilt.step == state.step
    assert rebuilt.identical_calls == {"abc": 2}
    assert rebuilt.version == 8
    assert rebuilt.last_full_version == 1
    assert rebuilt.saved_len == len(state.conversation)


def test_materialise_from_the_latest_full_row_after_a_rebase():
    state, rows = write_chain(11)

    chain = [(r.version, r.full, r.state) for r in rows if r.version >= 9]
    rebuilt = CheckpointState.materialise(chain)

    assert rebuilt is not None
    assert rebuilt.conversation == state.conversation
    assert rebuilt.last_full_version == 9


def test_a_materialised_state_keeps_writing_deltas_on_the_same_base():
    state, rows = write_chain(4)
    rebuilt = CheckpointState.materialise([(r.version, r.full, r.state) for r in rows])

    rebuilt.conversation.append({"role": "assistant", "content": "more"})
    row = rebuilt.next_checkpoint("model_response", AT)

    assert (row.version, row.full, row.base_version) == (5, False, 1)
    assert row.state["items"] == [{"role": "assistant", "content": "more"}]
    again = CheckpointState.materialise(
        [(r.version, r.full, r.state) for r in rows] + [(row.version, row.full, row.state)]
    )
    assert again.conversation == state.conversation + [{"role": "assistant", "content": "more"}]


def test_a_missing_version_breaks_the_chain():
    _, rows = write_chain(5)
    chain = [(r.version, r.full, r.state) for r in rows]

    assert CheckpointState.materialise(chain[:2] + chain[3:]) is None


def test_a_chain_must_start_at_a_full_row():
    _, rows = write_chain(5)
    chain = [(r.version, r.full, r.state) for r in rows]

    assert CheckpointState.materialise(chain[1:]) is None
    assert CheckpointState.materialise([]) is None


def test_a_full_row_inside_a_delta_chain_is_refused():
    _, rows = write_chain(10)
    chain = [(r.version, r.full, r.state) for r in rows]

    assert CheckpointState.materialise(chain) is None  # version 9 is full, not a delta of 1


def test_needs_full_forces_the_next_row_full_once():
    state = CheckpointState(conversation=[{"role": "user", "content": "a"}], version=3, needs_full=True)

    first = state.next_checkpoint("tool_batch", AT)
    state.conversation.append({"role": "user", "content": "b"})
    second = state.next_checkpoint("tool_batch", AT)

    assert (first.version, first.full) == (4, True)
    assert (second.version, second.full, second.base_version) == (5, False, 4)
    assert second.state["items"] == [{"role": "user", "content": "b"}]
