"""The run-time tool check of issue 34 item 4, in the pure pipeline with fakes:
a call whose tool the tenant's `allowed_tools` (AgentSpec.allowed_tools, set
by the composition root) no longer holds is a failed result
`tool_not_allowed` the model sees; nothing is executed, no watermark is
written. None (null: every tool) changes nothing. No database."""

from __future__ import annotations

import json
from dataclasses import replace

from runs.domain.loop import run_loop
from runs.domain.values import OutcomeKind
from tests.unit.fakes import build_context, echo_call, post_call


def restricted(turns, allowed):
    h = build_context(turns)
    h.ctx = replace(h.ctx, agent=replace(h.ctx.agent, allowed_tools=allowed))
    return h


def results(h) -> list[tuple[str, str]]:
    return [(m["tool_call_id"], m["content"]) for m in h.ctx.state.conversation if m["role"] == "tool"]


def test_a_pinned_tool_the_tenant_no_longer_allows_fails_tool_not_allowed_and_never_runs():
    h = restricted([{"tool_calls": [post_call(1), echo_call("fine")]}, {"text": "ok"}], frozenset({"echo"}))

    outcome = run_loop(h.ctx)

    assert outcome.kind is OutcomeKind.COMPLETED
    assert h.tools.count("post") == 0 and h.tools.count("echo") == 1
    assert h.store.watermarks == []  # no side effect was even started
    (refused, echoed) = results(h)
    assert refused[0] == "call_1_0" and json.loads(refused[1])["error"] == "tool_not_allowed"
    assert echoed == ("call_1_1", "fine")
    # the model's next request carries the refusal
    shown = [m for m in h.provider.requests[1].messages if m.get("tool_call_id") == "call_1_0"]
    assert shown and json.loads(shown[0]["content"])["error"] == "tool_not_allowed"
    inserted = {i.tool_name: i for i in h.store.invocation_inserts()}
    assert inserted["post"].status == "failed" and inserted["post"].error["error"] == "tool_not_allowed"
    failed = [e.payload for e in h.store.all_events() if e.type == "tool.call.failed"]
    assert [(p["tool"], p["executed"]) for p in failed] == [("post", False)]
    assert h.ctx.progress.usage.tool_calls == 1  # only echo counts


def test_null_allows_every_pinned_tool():
    h = restricted([{"tool_calls": [post_call(1)]}, {"text": "ok"}], None)

    run_loop(h.ctx)

    assert h.tools.count("post") == 1
    assert [json.loads(r[1]) for r in results(h)] == [{"posted": 1}]
