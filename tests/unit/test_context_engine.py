"""Context pressure, compaction, byte-identical builds and the synthesis
reserve (seed 002), on the domain core with fakes."""

from __future__ import annotations

from runs.domain.context import build_request
from runs.domain.context_engine import SYNTHESIS_INSTRUCTION, compact
from runs.domain.loop import run_loop
from runs.domain.values import OutcomeKind, RunLimits
from tests.unit.fakes import build_context, echo_call


def long_turns(n, size=400):
    return [{"tool_calls": [echo_call(f"{i}:" + "x" * size)]} for i in range(n)] + [{"text": "summary done"}]


def test_two_builds_of_one_checkpoint_are_byte_identical():
    h = build_context(long_turns(3))
    run_loop(h.ctx)
    first, p1 = build_request(h.ctx, 9, 1)
    second, p2 = build_request(h.ctx, 9, 2)
    assert p1 == p2
    assert first.model_dump_json(exclude={"attempt_number"}) == second.model_dump_json(exclude={"attempt_number"})


def test_a_long_conversation_is_compacted_and_keeps_every_call_with_its_result():
    h = build_context(long_turns(12), limits=RunLimits(max_steps=20, max_model_calls=30, max_tool_calls=30))
    h.ctx.agent.model["context_window"] = 2000
    outcome = run_loop(h.ctx)
    assert outcome.kind is OutcomeKind.COMPLETED
    compacted = [e for e in h.store.all_events() if e.type == "context.compacted"]
    assert compacted, "the conversation never outgrew the window"
    full = [c for c in h.store.checkpoints() if c.trigger == "compaction"]
    assert full and all(c.full for c in full)
    conv = h.ctx.state.conversation
    assert any(m.get("summary") for m in conv)
    # Every assistant tool call still in the conversation has its result right after it.
    answered = {m["tool_call_id"] for m in conv if m["role"] == "tool"}
    for m in conv:
        for call in m.get("tool_calls") or []:
            assert call["id"] in answered
    # Every request sent fit the budget after compaction.
    from runs.domain.context_engine import context_budget, measure

    assert all(measure(h.ctx, r) <= context_budget(h.ctx) for r in h.provider.requests)


def test_compaction_is_capped_at_two_per_step_then_context_overflow():
    h = build_context([{"tool_calls": [echo_call("y" * 6000)]}, {"text": "never"}], limits=RunLimits(max_steps=5))
    h.ctx.agent.model["context_window"] = 600
    outcome = run_loop(h.ctx)
    assert outcome.kind is OutcomeKind.FAILED and outcome.failure.reason == "context_overflow"


def test_compact_never_splits_a_call_from_its_result():
    conv = [{"role": "user", "content": "go"}]
    for i in range(5):
        conv += [
            {"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "name": "echo", "arguments": "{}"}]},
            {"role": "tool", "tool_call_id": f"c{i}", "name": "echo", "content": "r", "is_error": False},
        ]
    out = compact(conv)
    assert out[0] == conv[0] and out[1]["summary"]
    kept_calls = [c["id"] for m in out for c in (m.get("tool_calls") or [])]
    kept_results = [m["tool_call_id"] for m in out if m["role"] == "tool"]
    assert kept_calls == kept_results and kept_calls == ["c2", "c3", "c4"]


def test_with_24_calls_and_a_reserve_of_2_call_22_gets_the_instruction_and_no_tools():
    turns = [{"tool_calls": [echo_call(str(i))]} for i in range(21)] + [{"text": "final answer"}]
    h = build_context(
        turns,
        limits=RunLimits(
            max_steps=40,
            max_model_calls=24,
            max_tool_calls=64,
            synthesis_reserve_model_calls=2,
            synthesis_reserve_tool_calls=0,
        ),
    )
    outcome = run_loop(h.ctx)
    assert outcome.kind is OutcomeKind.COMPLETED and outcome.final_message == "final answer"
    reqs = h.provider.requests
    assert len(reqs) == 22
    assert all(r.tools and r.tool_choice == "auto" for r in reqs[:21])
    call_22 = reqs[21]
    assert call_22.tools == [] and call_22.tool_choice == "none"
    assert call_22.messages[-1] == {"role": "system", "content": SYNTHESIS_INSTRUCTION}
    # The instruction is volatile: never checkpointed.
    assert all(SYNTHESIS_INSTRUCTION not in str(c.state) for c in h.store.checkpoints())


def test_a_tool_call_inside_the_reserve_fails_closed():
    turns = [{"tool_calls": [echo_call(str(i))]} for i in range(30)]
    h = build_context(
        turns,
        limits=RunLimits(
            max_steps=40, max_model_calls=24, synthesis_reserve_model_calls=2, synthesis_reserve_tool_calls=0
        ),
    )
    outcome = run_loop(h.ctx)
    assert outcome.kind is OutcomeKind.FAILED
    assert (
        outcome.failure.error_class == "SynthesisReserveViolation"
        and outcome.failure.details["dimension"] == "model_calls"
    )
    assert h.tools.count("echo") == 21
