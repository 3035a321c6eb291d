"""The stored form's pieces without a database: the reference codec, which
items an event holds, and a row's encoding (runs.domain.stored_form)."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from runs.domain import stored_form as sf
from runs.domain.checkpoint import CheckpointState
from runs.domain.writes import EventWrite

AT = datetime(2025, 1, 1, tzinfo=UTC)


def test_references_of_steps_that_look_alike_stay_the_same_length_however_long_the_run():
    def refs(steps: int) -> list[int]:
        out, seq = [], 7
        for _ in range(steps):
            out += [seq, seq + 4]
            seq += 7
        return out

    short, long = sf.encode_refs(refs(10)), sf.encode_refs(refs(4000))
    assert sf.decode_refs(long) == refs(4000)
    assert len(long) - len(short) <= 3  # only the repeat count's digits grow
    assert long == "7 4.3*3999 4"


@pytest.mark.parametrize("seed", range(40))
def test_any_list_of_sequences_round_trips(seed):
    rnd = random.Random(seed)
    seqs = [rnd.randint(1, 10_000)]
    for i in range(rnd.randint(0, 400)):
        gap = rnd.choice([1, 2, 3, 4, 5, 9, -3, 40]) if rnd.random() < 0.4 else (4, 3, 5)[i % 3]
        seqs.append(seqs[-1] + gap)
    assert sf.decode_refs(sf.encode_refs(seqs)) == seqs


def test_an_event_holds_an_item_only_when_it_reads_back_as_that_item():
    calls = [{"id": "c1", "name": "echo", "arguments": '{"text": "x"}'}]
    turn = EventWrite("model.response.completed", {"step": 1, "text": None, "tool_calls": calls}, AT)
    assert sf.holds(turn, sf.assistant_item(None, calls))
    assert not sf.holds(turn, sf.assistant_item("other", calls))

    result = {"b": 1, "a": [1.5, None]}
    done = EventWrite("tool.call.completed", {"call_id": "c1", "tool": "echo", "result": result}, AT)
    assert sf.holds(done, sf.tool_item("c1", "echo", result, False))
    assert not sf.holds(done, sf.tool_item("c1", "echo", result, True))  # the event says it succeeded
    assert not sf.holds(done, sf.tool_item("c1", "other name", result, False))
    assert sf.item_from_event(done.type, done.payload) == sf.tool_item("c1", "echo", result, False)

    for odd in ({"n": 1e16}, {"n": float("nan")}, {"n": -0.0}, {1: "int key"}):
        shaky = EventWrite("tool.call.completed", {"call_id": "c1", "tool": "echo", "result": odd}, AT)
        try:
            item = sf.tool_item("c1", "echo", odd, False)
        except TypeError:  # mixed keys cannot be sorted: such a result is never linked either
            continue
        assert not sf.holds(shaky, item), odd
    unknown = EventWrite(
        "tool.call.failed", {"call_id": "c1", "tool": "echo", "result": None, "awaiting_decision": True}, AT
    )
    assert not sf.holds(unknown, sf.tool_item("c1", "echo", None, True))


def test_a_row_names_committed_events_by_sequence_its_own_by_ordinal_and_keeps_the_rest_inline():
    state = CheckpointState(conversation=[{"role": "user", "content": "hi"}])
    old = [EventWrite("x", {}, AT, sequence=s) for s in (10, 14, 17, 21)]
    for event in old:
        item = {"role": "tool", "content": str(event.sequence)}
        state.conversation.append(item)
        state.backed_by(item, event)
    summary = {"role": "user", "content": "[summary]", "summary": True}
    state.conversation.append(summary)
    unit = [EventWrite("model.request.started", {}, AT), EventWrite("y", {}, AT)]
    mine = {"role": "tool", "content": "mine"}
    state.conversation.append(mine)
    state.backed_by(mine, unit[1])
    lost = {"role": "tool", "content": "lost"}  # its unit was never committed
    state.conversation.append(lost)
    state.backed_by(lost, EventWrite("z", {}, AT))

    row = state.next_checkpoint("suspension", AT)
    stored = sf.encode(row, unit)
    assert stored["conversation"] == [{"role": "user", "content": "hi"}, "10 4 3 4", summary, {"u": [2]}, lost]
    assert sf.referenced({**stored, "events_from": 40}) == [10, 14, 17, 21, 42]
    assert "identical_calls" not in stored and stored["form"] == sf.FORM


def test_a_row_names_the_events_of_the_unit_in_flight_before_its_own_by_ordinal():
    """Commit 2's full row, built while commit 1 is in flight: the turn
    commit 1 holds is `{"p": [k]}` (located by `prior_from`), the results
    this unit holds `{"u": [k]}`; without the unit before, the turn would
    stay inline."""
    state = CheckpointState(conversation=[{"role": "user", "content": "hi"}])
    done = EventWrite("x", {}, AT, sequence=5)
    first = {"role": "tool", "content": "5"}
    state.conversation.append(first)
    state.backed_by(first, done)
    prior = [EventWrite("model.response.completed", {}, AT), EventWrite("run.checkpointed", {}, AT)]
    turn = {"role": "assistant", "content": None, "tool_calls": []}
    state.conversation.append(turn)
    state.backed_by(turn, prior[0])
    unit = [EventWrite("tool.call.completed", {}, AT), EventWrite("tool.call.completed", {}, AT)]
    results = [{"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}]
    for item, event in zip(results, unit, strict=True):
        state.conversation.append(item)
        state.backed_by(item, event)

    row = state.next_checkpoint("suspension", AT)
    stored = sf.encode(row, unit, prior)
    assert sf.names_prior(stored)
    assert stored["conversation"] == [{"role": "user", "content": "hi"}, "5", {"p": [1]}, {"u": [1, 2]}]
    stored = {**stored, "events_from": 30, "prior_from": 20}
    assert sf.referenced(stored) == [5, 21, 31, 32]
    events = {
        5: ("tool.call.completed", {"call_id": None, "tool": None, "result": "5"}),
        21: ("model.response.completed", {"text": None, "tool_calls": []}),
        31: ("tool.call.completed", {"call_id": None, "tool": None, "result": "a"}),
        32: ("tool.call.completed", {"call_id": None, "tool": None, "result": "b"}),
    }
    materialised = sf.materialised(stored, events)
    assert materialised is not None
    assert [i["content"] for i in materialised[0]["conversation"]] == ["hi", "5", None, "a", "b"]
    assert "prior_from" not in materialised[0]
    assert sf.materialised({**stored, "prior_from": None}, events) is None  # unlocated: the chain is not used

    inline = sf.encode(row, unit)  # no unit before: the turn is kept as it is
    assert inline["conversation"][2] == turn and not sf.names_prior(inline)


@pytest.mark.parametrize("seed", range(40))
def test_a_run_of_references_built_one_at_a_time_decodes_to_what_was_added(seed):
    rnd = random.Random(1000 + seed)
    seqs = [rnd.randint(1, 10_000)]
    for i in range(rnd.randint(0, 400)):
        gap = rnd.choice([1, 2, 3, 9, -3, 40]) if rnd.random() < 0.3 else (4, 3, 5, 4)[i % (2 + seed % 3)]
        seqs.append(seqs[-1] + gap)
    run = sf.RefRun(seqs[0])
    for i, seq in enumerate(seqs[1:], start=2):
        run.add(seq)
        if i % 37 == 0:  # read part way, as each full row does
            assert sf.decode_refs(run.text()) == seqs[:i]
    assert sf.decode_refs(run.text()) == seqs


def test_full_rows_carry_the_settled_head_on_without_looking_at_it_again():
    state = CheckpointState(conversation=[{"role": "user", "content": "hi"}])
    seq = 5
    for _ in range(40):
        item = {"role": "tool", "content": str(seq)}
        state.conversation.append(item)
        state.backed_by(item, EventWrite("x", {}, AT, sequence=seq))
        seq += 4
    first = state.next_checkpoint("suspension", AT)
    assert first.prefix == ([{"role": "user", "content": "hi"}, "5 4*39"], 41) and first.sources == []
    looked: list = []
    lookup = state.source_of
    state.source_of = lambda item: looked.append(item) or lookup(item)  # type: ignore[method-assign]
    fresh = EventWrite("y", {}, AT)  # not committed yet: it stays out of the head
    item = {"role": "tool", "content": "new"}
    state.conversation.append(item)
    state.backed_by(item, fresh)
    second = state.next_checkpoint("suspension", AT)
    assert second.prefix == ([{"role": "user", "content": "hi"}, "5 4*39"], 41) and second.sources == [fresh]
    assert looked == [item, item]  # the new item only: once for the head, once for the tail
    stored = sf.encode(second, [fresh])
    assert stored["conversation"][-1] == {"u": [1]}
