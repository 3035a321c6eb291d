"""The context measure goes on from the running prefix hash (issue 16 item 2):
it equals encoding the whole request, and a step encodes only what is new."""

from __future__ import annotations

import pytest

from runs.domain import context as context_module
from runs.domain import context_engine
from runs.domain.context_engine import SYNTHESIS_INSTRUCTION, estimate_tokens
from runs.domain.loop import run_loop
from runs.domain.values import OutcomeKind, RunLimits
from tests.unit.fakes import build_context, echo_call


def _whole(request) -> int:
    return estimate_tokens({"instructions": request.instructions, "tools": request.tools, "messages": request.messages})


@pytest.fixture
def measured(monkeypatch):
    """Every measure the loop takes, beside the whole request's encoding."""
    seen: list[tuple[int, int, bool]] = []
    measure = context_engine.measure

    def checked(ctx, request):
        cache = ctx.progress.prefix
        incremental = cache is not None and cache.messages is ctx.state.conversation
        seen.append((measure(ctx, request), _whole(request), incremental))
        return seen[-1][0]

    monkeypatch.setattr(context_engine, "measure", checked)
    return seen


def test_the_measure_equals_the_whole_requests_encoding_step_after_step(measured):
    turns = [{"tool_calls": [echo_call(f"{i}: ünïcode \u2028 " + "x" * 300)]} for i in range(8)] + [{"text": "done"}]
    h = build_context(turns, limits=RunLimits(max_steps=20, max_model_calls=30, max_tool_calls=30))
    h.ctx.agent.model["context_window"] = 1_000_000
    assert run_loop(h.ctx).kind is OutcomeKind.COMPLETED
    assert len(measured) == 9
    assert [m for m, whole, _ in measured] == [whole for _, whole, _ in measured]
    assert sum(1 for *_, incremental in measured if incremental) == 9  # none fell back to encoding it all


def test_the_measure_stays_exact_across_compactions_and_the_synthesis_instruction(measured):
    turns = [{"tool_calls": [echo_call(f"{i}:" + "y" * 400)]} for i in range(9)] + [{"text": "summary"}]
    limits = RunLimits(
        max_steps=30,
        max_model_calls=12,
        max_tool_calls=40,
        synthesis_reserve_model_calls=2,
        synthesis_reserve_tool_calls=0,
    )
    h = build_context(turns, limits=limits)
    h.ctx.agent.model["context_window"] = 1200
    assert run_loop(h.ctx).kind is OutcomeKind.COMPLETED
    assert any(e.type == "context.compacted" for e in h.store.all_events())
    assert h.provider.requests[-1].messages[-1] == {"role": "system", "content": SYNTHESIS_INSTRUCTION}
    assert len(measured) >= 10 and [m for m, whole, _ in measured] == [whole for _, whole, _ in measured]
    assert any(incremental for *_, incremental in measured)


def test_a_step_encodes_what_is_new_not_the_whole_conversation(monkeypatch):
    """On the old measure, the characters encoded per step grew with every
    step (the whole conversation, 1 KiB more each time)."""
    encoded: list[int] = []
    canonical = context_module.canonical_json

    def counting(value):
        text = canonical(value)
        encoded.append(len(text))
        return text

    monkeypatch.setattr(context_module, "canonical_json", counting)
    monkeypatch.setattr(context_engine, "canonical_json", counting)
    per_step: list[int] = []
    original = context_engine.measure

    def after_each_measure(ctx, request):
        value = original(ctx, request)
        per_step.append(sum(encoded))
        encoded.clear()
        return value

    monkeypatch.setattr(context_engine, "measure", after_each_measure)
    turns = [{"tool_calls": [echo_call(f"{i}:" + "z" * 1024)]} for i in range(30)] + [{"text": "done"}]
    h = build_context(turns, limits=RunLimits(max_steps=40, max_model_calls=40, max_tool_calls=40))
    h.ctx.agent.model["context_window"] = 10_000_000
    assert run_loop(h.ctx).kind is OutcomeKind.COMPLETED
    assert len(per_step) == 31
    # From the third step on, each step encodes one assistant item and one
    # 1 KiB result (plus the small head once): never the 30 KiB behind them.
    assert max(per_step[2:]) < 4 * 1024, per_step
