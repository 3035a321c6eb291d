"""Seed 002's stored form (issue 16 item 1): checkpoints name the events that
hold the conversation and the repository materialises them on read.

The round trip is checked on recorded runs: every checkpoint version of a run
is read back through the stored form (the rows in the database, the events
they name) and compared with the same version in its materialised form, as
the loop handed it to the store (`stored_form.encode` is wrapped to keep a
copy; it still writes what it always writes)."""

from __future__ import annotations

import copy
import json

import pytest
from django.db import connection

from approvals.models import Approval
from approvals.services import approval_decide
from checkpoints.models import Checkpoint
from checkpoints.repository import checkpoint_current, checkpoint_latest, materialise_rows
from maintenance.sweeps.prune import sweep_prune
from runs.domain import stored_form
from runs.domain.checkpoint import CheckpointState
from runs.domain.values import ToolSpec
from runs.models import Run, ToolInvocation
from runs.runtime.executor import run_drive
from runs.services.inputs import run_input
from runs.tools import REGISTRY

pytestmark = pytest.mark.django_db(transaction=True)

NEEDS_APPROVAL = {
    "default": "allow",
    "rules": [{"tool": "echo", "decision": "require_approval", "when": {"arg": "text", "op": "eq", "value": "ask"}}],
}


ROOMY = {"max_steps": 60, "max_model_calls": 60, "max_tool_calls": 120}


@pytest.fixture
def load_agent(load_agent):
    """Agents with room for the longer runs below."""

    def load(**kw):
        return load_agent(limits=ROOMY, **kw)

    return load


@pytest.fixture
def written(monkeypatch):
    """The materialised form of every checkpoint the store writes, by version."""
    rows: dict[int, dict] = {}
    encode = stored_form.encode

    def keep(row, unit_events, *prior):
        rows[row.version] = copy.deepcopy(row.state)
        return encode(row, unit_events, *prior)

    monkeypatch.setattr(stored_form, "encode", keep)
    return rows


@pytest.fixture
def odd_results():
    """A read-only tool whose result is JSON the events table reorders (keys
    out of order, nesting, unicode, numbers), and one that fails."""

    def shaped(arguments, context):
        return {"zeta": [3, 2.5, {"b": None, "a": True}], "alpha": "é ✓", "mid": {"y": 1, "x": "\n"}}

    def broken(arguments, context):
        raise RuntimeError("boom")

    REGISTRY.register(ToolSpec(name="shaped", parameters={"type": "object"}, read_only=True), shaped)
    REGISTRY.register(ToolSpec(name="broken", parameters={"type": "object"}, read_only=True), broken)
    yield
    REGISTRY.unregister("shaped")
    REGISTRY.unregister("broken")


def echo_turns(n: int, word: str = "s") -> list[dict]:
    """n steps of one echo call each, then the answer."""
    return [{"tool_calls": [{"name": "echo", "arguments": {"text": f"{word} {i}"}}]} for i in range(n)] + [
        {"text": "done"}
    ]


def drive(run) -> str:
    """Drive the run once; its outcome, or its failure when it failed."""
    kind = run_drive(run_id=run.id).kind.value
    return kind if kind != "failed" else f"failed: {Run.objects.get(id=run.id).failure}"


def stored_rows(run_id) -> list[tuple[int, bool, dict]]:
    return list(Checkpoint.objects.filter(run_id=run_id).order_by("version").values_list("version", "full", "state"))


def assert_round_trip(run_id, written: dict[int, dict]) -> list[tuple[int, bool, dict]]:
    """Every version read through the stored form equals its materialised form."""
    rows = stored_rows(run_id)
    assert any(stored_form.is_stored(state) for _, _, state in rows)
    logical = {v: written.get(v, state) for v, _, state in rows}  # version 1 is written inline at submission
    for version, _, _ in rows:
        base = max(v for v, full, _ in rows if full and v <= version)
        chain = [(v, full, state) for v, full, state in rows if base <= v <= version]
        got = materialise_rows(run_id, chain)
        want = CheckpointState.materialise([(v, full, logical[v]) for v, full, _ in chain])
        assert got is not None and want is not None, version
        assert got.conversation == want.conversation, version
        assert (got.step, got.pending_tool_calls, got.denials) == (want.step, want.pending_tool_calls, want.denials)
    return rows


def state_trigger(run_id, version: int) -> str:
    return Checkpoint.objects.get(run_id=run_id, version=version).trigger


def inline_items(state: dict) -> list[dict]:
    return [p for p in state.get("conversation", state.get("items")) if isinstance(p, dict) and "role" in p]


def test_an_echo_run_round_trips_and_its_full_rows_keep_only_the_input_inline(load_agent, submit, written):
    load_agent(turns=echo_turns(30, "step"))
    run = submit(text="go")
    assert drive(run) == "completed"

    rows = assert_round_trip(run.id, written)
    fulls = [state for v, full, state in rows if full and v > 1]
    assert len(fulls) >= 4
    assert all(inline_items(state) == [{"role": "user", "content": "go"}] for state in fulls)
    # Each full row after a batch was sent behind its step's commit 1 and
    # names that commit's turn event by ordinal ({"p": ...}, `prior_from`).
    batch = [state for v, full, state in rows if full and v > 1 and state_trigger(run.id, v) == "tool_batch"]
    assert len(batch) >= 4 and all(stored_form.names_prior(state) for state in batch)
    assert all(isinstance(state["prior_from"], int) for state in batch)
    # Every row written with events records where they start, named or not:
    # the unit after it may name them (`prior_from` is read from this).
    assert all(isinstance(state.get("events_from"), int) for v, _, state in rows if v > 1)
    sizes = [len(json.dumps(state)) for state in batch]
    assert max(sizes) - min(sizes) <= 8, sizes  # the same shape of step: the references do not grow
    final = checkpoint_latest(run.id)
    assert final is not None and len(final.conversation) == 1 + 2 * 30 + 1


def test_a_refused_call_in_a_pipelined_step_is_named_in_commit_1_by_commit_2s_row(load_agent, submit, written):
    """An unknown tool is refused in commit 1 (its result is commit 1's
    event); the echo beside it runs while commit 1 is in flight, and commit 2
    goes out behind it: commit 2's row names the refused result by its
    ordinal in commit 1 (`{"p": ...}`) and reads back as the same item."""
    load_agent(
        turns=[
            {"tool_calls": [{"name": "nope", "arguments": {}}, {"name": "echo", "arguments": {"text": "x"}}]},
            {"text": "done"},
        ]
    )
    run = submit()
    assert drive(run) == "completed"

    rows = assert_round_trip(run.id, written)
    batch = [state for v, _, state in rows if state_trigger(run.id, v) == "tool_batch"]
    assert len(batch) == 1 and stored_form.names_prior(batch[0]), batch
    final = checkpoint_latest(run.id)
    tools = [m for m in final.conversation if m["role"] == "tool"]
    assert [(t["name"], t["is_error"]) for t in tools] == [("nope", True), ("echo", False)]


def test_a_mixed_batch_round_trips_refused_failed_and_reordered_results(load_agent, submit, written, odd_results):
    load_agent(
        turns=[
            {
                "tool_calls": [
                    {"name": "shaped", "arguments": {}},
                    {"name": "nope", "arguments": {}},  # unknown: refused in commit 1, before the others ran
                    {"name": "broken", "arguments": {}},
                    {"name": "echo", "arguments": {"text": "x"}},
                ]
            },
            {"tool_calls": [{"name": "echo", "arguments": "not json"}]},
            {"tool_calls": [{"name": "shaped", "arguments": {}}, {"name": "echo", "arguments": {"text": "y"}}]},
            {"text": "done"},
        ],
        tools=("echo", "shaped", "broken"),
    )
    run = submit()
    assert drive(run) == "completed"

    rows = assert_round_trip(run.id, written)
    final = checkpoint_latest(run.id)
    tools = [m for m in final.conversation if m["role"] == "tool"]
    assert [m["is_error"] for m in tools] == [False, True, True, False, True, False, False]
    assert json.loads(tools[0]["content"])["alpha"] == "é ✓"
    assert tools[0]["content"] == json.dumps(json.loads(tools[0]["content"]), ensure_ascii=False, sort_keys=True)
    assert inline_items(rows[-1][2]) == [{"role": "user", "content": "hello"}]  # every answer is a reference


def test_approval_input_and_compaction_round_trip(load_agent, submit, operator, written):
    turns = [
        {"tool_calls": [{"name": "echo", "arguments": {"text": "ask"}}]},
        {"tool_calls": [{"name": "ask_user", "arguments": {"question": "which?"}}]},
    ]
    turns += [{"tool_calls": [{"name": "echo", "arguments": {"text": "word " * 25 + str(i)}}]} for i in range(6)]
    load_agent(
        tools=("echo", "ask_user"),
        policy=NEEDS_APPROVAL,
        model={"provider": "scripted", "context_window": 900, "turns": turns + [{"text": "done"}]},
    )
    run = submit()
    assert drive(run) == "suspended"
    approval = Approval.objects.get(run_id=run.id)
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash)
    assert drive(run) == "suspended"  # ask_user
    run_input(run=Run.objects.get(id=run.id), text="the blue one")
    assert drive(run) == "completed"

    rows = assert_round_trip(run.id, written)
    assert {"compaction", "suspension"} <= {state_trigger(run.id, v) for v, _, _ in rows}
    final = checkpoint_latest(run.id)
    summaries = [m for m in final.conversation if m.get("summary")]
    assert summaries, "the context window forced a compaction"
    assert all(m in inline_items(rows[-1][2]) for m in summaries)  # a summary is held by no event: inline


def test_a_run_whose_checkpoints_are_in_the_old_inline_form_resumes(load_agent, submit, operator, written):
    """A run that waits on an approval, its checkpoints rewritten as the code
    before the stored form wrote them (every item inline, identical-call
    counts in the row), is approved and completes from them."""
    load_agent(
        turns=[
            {"tool_calls": [{"name": "echo", "arguments": {"text": "one"}}]},
            {"tool_calls": [{"name": "echo", "arguments": {"text": "ask"}}]},
            {"text": "done"},
        ],
        policy=NEEDS_APPROVAL,
    )
    run = submit()
    assert drive(run) == "suspended"
    before = checkpoint_latest(run.id)
    for version, full, state in stored_rows(run.id):
        old = dict(written.get(version, state))
        old.setdefault("identical_calls" if full else "identical_calls_changed", {})
        Checkpoint.objects.filter(run_id=run.id, version=version).update(state=old)
    assert not any(stored_form.is_stored(state) for _, _, state in stored_rows(run.id))
    legacy = checkpoint_latest(run.id)
    assert legacy is not None and legacy.conversation == before.conversation

    approval = Approval.objects.get(run_id=run.id)
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash)
    assert drive(run) == "completed"
    assert Run.objects.get(id=run.id).final_message == "done"
    assert ToolInvocation.objects.get(run_id=run.id, step_number=2).attempt == 1  # the approved call ran once
    final = checkpoint_latest(run.id)
    assert [m["role"] for m in final.conversation] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert final.conversation[:3] == before.conversation[:3]
    assert_round_trip(run.id, written)  # chains that mix old-form rows and stored ones read back too


def test_identical_call_counts_are_the_calls_that_ran(load_agent, submit):
    """Counted from the invocation rows, as the loop counted them: a call
    that ran counts, a call policy denied does not (the second identical
    call leaves the count one below the limit: the next turn is the answer)."""

    def echo(text: str) -> dict:
        return {"tool_calls": [{"name": "echo", "arguments": {"text": text}}]}

    load_agent(
        turns=[echo("same"), echo("other"), echo("no"), echo("same"), {"text": "done"}],
        policy={
            "default": "allow",
            "rules": [{"tool": "echo", "decision": "deny", "when": {"arg": "text", "op": "eq", "value": "no"}}],
        },
    )
    run = submit()
    assert drive(run) == "completed"
    counts = sorted(checkpoint_current(Run.objects.get(id=run.id)).identical_calls.values())
    assert counts == [1, 2]  # "same" twice, "other" once; the denied "no" never ran
    assert all("identical_calls" not in state for _, full, state in stored_rows(run.id) if full and state.get("form"))


def test_a_pruned_run_keeps_a_final_snapshot_that_still_materialises(load_agent, submit):
    load_agent(turns=echo_turns(10))
    run = submit()
    assert drive(run) == "completed"
    before = checkpoint_latest(run.id)
    assert sweep_prune()["deleted"] > 0
    rows = stored_rows(run.id)
    assert len(rows) == 1 and rows[0][1] and stored_form.is_stored(rows[0][2])
    after = checkpoint_latest(run.id)
    assert after is not None and after.conversation == before.conversation


def test_a_stored_row_naming_an_event_the_log_lacks_is_not_used(load_agent, submit):
    """The chain is dispensable: a reference that does not resolve makes the
    repository rebuild from the log (seed_checkpoint) rather than guess."""
    load_agent(turns=echo_turns(3))
    run = submit()
    assert drive(run) == "completed"
    newest = Checkpoint.objects.filter(run_id=run.id).order_by("-version").first()
    state = dict(newest.state)
    state["conversation"] = state["conversation"] + ["999999"]
    Checkpoint.objects.filter(id=newest.id).update(state=state)
    assert checkpoint_latest(run.id) is None
    rebuilt = checkpoint_current(Run.objects.get(id=run.id))
    assert [m["role"] for m in rebuilt.conversation][-2:] == ["tool", "assistant"]


def test_events_named_by_a_checkpoint_are_read_in_one_query(load_agent, submit, django_assert_max_num_queries):
    load_agent(turns=echo_turns(12))
    run = submit()
    assert drive(run) == "completed"
    connection.close()  # a fresh connection: nothing cached
    with django_assert_max_num_queries(3):  # the newest row, the chain, the events
        state = checkpoint_latest(run.id)
    assert state is not None and len(state.conversation) == 1 + 2 * 12 + 1


def test_the_next_run_of_a_session_starts_from_the_session_history(load_agent, submit, written):
    load_agent(turns=echo_turns(3))
    first = submit(text="first question")
    assert drive(first) == "completed"
    second = submit(text="second question", session=str(first.session_id))
    assert drive(second) == "completed"

    assert_round_trip(second.id, written)
    final = checkpoint_latest(second.id)
    assert final.conversation[:3] == [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "done", "tool_calls": []},
        {"role": "user", "content": "second question"},
    ]
    assert len(final.conversation) == 3 + 2 * 3 + 1
