"""Runs executed in-process against the real PostgreSQL schema."""

from __future__ import annotations

import json
import threading
from unittest.mock import patch

import pytest
from django.db import connection

from runs.models import Event, ModelCall, Run, ToolInvocation
from runs.runtime.executor import execute_run, run_drive
from runs.runtime.queue import run_claim

pytestmark = pytest.mark.django_db(transaction=True)


def events(run):
    return list(Event.objects.filter(run_id=run.id).order_by("sequence").values_list("type", flat=True))


def reload(run):
    return Run.objects.get(id=run.id)


def echo_step(text):
    return {"tool_calls": [{"name": "echo", "arguments": {"text": text}}]}


def is_subsequence(expected, actual):
    it = iter(actual)
    return all(any(e == a for a in it) for e in expected)


def test_three_tool_steps_complete_with_the_expected_event_order(load_agent, submit):
    load_agent(turns=[echo_step("a"), echo_step("b"), echo_step("c"), {"text": "all done"}])
    run = submit()
    outcome = run_drive(run_id=run.id)
    run = reload(run)
    assert outcome.kind.value == "completed"
    assert run.status == "COMPLETED"
    assert run.final_message == "all done"
    assert run.lease_owner is None and run.lease_expires_at is None
    assert run.step_count == 4
    seen = events(run)
    step = [
        "model.request.started",
        "model.response.completed",
        "run.checkpointed",
        "tool.call.proposed",
        "tool.call.authorized",
        "tool.call.completed",
        "run.checkpointed",
    ]
    expected = (
        ["run.created", "run.claimed", "run.started"]
        + step * 3
        + ["model.request.started", "model.response.completed", "run.checkpointed", "run.completed"]
    )
    assert seen == expected
    # Sequences are contiguous per session.
    seqs = list(Event.objects.filter(session_id=run.session_id).order_by("sequence").values_list("sequence", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    results = list(ToolInvocation.objects.filter(run=run).order_by("step_number").values_list("status", "result"))
    assert results == [("completed", "a"), ("completed", "b"), ("completed", "c")]


def test_every_step_has_a_persisted_identity(load_agent, submit):
    load_agent(turns=[echo_step("a"), {"attempts": [{"empty": True}, {"text": "ok"}]}])
    run = submit()
    run_drive(run_id=run.id)
    run = reload(run)
    distinct_steps = ModelCall.objects.filter(run=run).values("step_number").distinct().count()
    assert run.status == "COMPLETED"
    assert run.step_count == distinct_steps == 2
    assert ModelCall.objects.filter(run=run, step_number=2).count() == 2  # the empty attempt and the retry


@pytest.mark.parametrize(
    "call, code",
    [
        ({"name": "echo", "arguments": "{not json"}, "invalid_arguments"),
        ({"name": "rm_rf", "arguments": {}}, "unknown_tool"),
        ({"name": "echo", "arguments": {"text": 5}}, "schema_invalid"),
        ({"name": "echo", "arguments": {"text": "x", "tenant_id": "other"}}, "schema_invalid"),
        ({"name": "echo", "arguments": "[1, 2]"}, "invalid_arguments"),
    ],
)
def test_malformed_calls_become_results_the_model_sees_and_never_execute(load_agent, submit, call, code):
    load_agent(turns=[{"tool_calls": [call]}, {"text": "recovered"}])
    run = submit()
    run_drive(run_id=run.id)
    run = reload(run)
    assert run.status == "COMPLETED"
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "failed"
    assert inv.result["error"] == code
    assert inv.effect_sent_at is None
    assert run.usage["tool_calls"] == 0
    failed = Event.objects.get(run=run, type="tool.call.failed")
    assert failed.payload["executed"] is False
    # The model saw it: the next step's request carried the failed result.
    from checkpoints.repository import checkpoint_latest

    tool_msgs = [m for m in checkpoint_latest(run.id).conversation if m["role"] == "tool"]
    assert tool_msgs and tool_msgs[0]["is_error"] is True and code in tool_msgs[0]["content"]


def test_max_steps_fails_the_run_and_it_is_never_requeued(load_agent, submit):
    load_agent(turns=[echo_step(f"page {i}") for i in range(10)], limits={"max_steps": 3, "max_tool_calls": 50})
    run = submit()
    # (a model repeating one call is stopped by the breaker first: tests/integration/test_guards.py)
    run_drive(run_id=run.id)
    run = reload(run)
    assert run.status == "FAILED"
    assert run.failure["reason"] == "max_steps_exceeded"
    assert run.step_count == 3
    assert "run.requeued" not in events(run)
    # A second doorbell finds nothing to do.
    assert run_drive(run_id=run.id) is None
    assert reload(run).status == "FAILED"


def test_model_call_budget_fails_before_the_attempt(load_agent, submit):
    load_agent(
        turns=[echo_step("a")], limits={"max_model_calls": 2, "max_steps": 10, "synthesis_reserve_model_calls": 0}
    )
    run = submit()
    run_drive(run_id=run.id)
    run = reload(run)
    assert run.status == "FAILED"
    assert run.failure["reason"] == "budget_exceeded"
    assert ModelCall.objects.filter(run=run).exclude(status="abandoned").count() == 2
    assert run.usage["model_calls"] == 2


def test_empty_turns_retry_three_attempts_then_fail(load_agent, submit):
    load_agent(turns=[{"empty": True}])
    run = submit()
    run_drive(run_id=run.id)
    run = reload(run)
    assert run.status == "FAILED"
    assert run.failure["reason"] == "empty_model_turn"
    assert list(
        ModelCall.objects.filter(run=run).order_by("attempt_number").values_list("attempt_number", "status")
    ) == [(1, "failed"), (2, "failed"), (3, "failed")]


def test_transient_errors_retry_under_the_same_cap(load_agent, submit):
    load_agent(turns=[{"attempts": [{"error": "transient"}, {"error": "transient"}, {"text": "third time"}]}])
    run = submit()
    run_drive(run_id=run.id)
    run = reload(run)
    assert run.status == "COMPLETED" and run.final_message == "third time"
    load_agent(name="flaky", turns=[{"error": "transient"}])
    run2 = submit(agent="flaky")
    run_drive(run_id=run2.id)
    run2 = reload(run2)
    assert run2.status == "FAILED" and run2.failure["reason"] == "dependency_unavailable"
    assert Event.objects.filter(run=run2, type="model.response.failed").count() == 3


def test_max_tokens_without_tool_calls_completes_with_the_truncated_text(load_agent, submit):
    load_agent(turns=[{"text": "partial answ", "stop_reason": "max_tokens"}])
    run = submit()
    run_drive(run_id=run.id)
    run = reload(run)
    assert run.status == "COMPLETED" and run.final_message == "partial answ"


def test_tool_call_budget_fits_the_batch(load_agent, submit):
    load_agent(
        turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": str(i)}} for i in range(3)]}, {"text": "ok"}],
        limits={"max_tool_calls": 1},
    )
    run = submit()
    run_drive(run_id=run.id)
    run = reload(run)
    rows = list(ToolInvocation.objects.filter(run=run).order_by("call_index").values_list("status", "result"))
    assert rows[0] == ("completed", "0")
    assert [r[1]["error"] for r in rows[1:]] == ["tool.budget_exhausted", "tool.budget_exhausted"]
    assert run.usage["tool_calls"] == 1 and run.status == "COMPLETED"


def test_policy_deny_gives_a_denied_result_and_require_approval_suspends_the_batch(load_agent, submit):
    load_agent(
        turns=[
            {
                "tool_calls": [
                    {"name": "echo", "arguments": {"text": "no"}},
                    {"name": "echo", "arguments": {"text": "ask"}},
                ]
            },
            {"text": "ok"},
        ],
        policy={
            "default": "allow",
            "rules": [
                {"tool": "echo", "decision": "deny", "when": {"arg": "text", "op": "eq", "value": "no"}},
                {"tool": "echo", "decision": "require_approval"},
            ],
        },
    )
    run = submit()
    run_drive(run_id=run.id)
    rows = list(ToolInvocation.objects.filter(run_id=run.id).order_by("call_index").values_list("status", "result"))
    assert [r[0] for r in rows] == ["failed", "awaiting_approval"]
    assert rows[0][1]["error"] == "denied_by_policy"
    row = reload(run)
    assert row.status == "WAITING_FOR_APPROVAL" and row.lease_owner is None


def test_a_fenced_worker_writes_nothing_but_run_fenced(load_agent, submit):
    load_agent(turns=[echo_step("a"), echo_step("b"), {"text": "done"}])
    run = submit()
    claim = run_claim(run_id=run.id, owner="worker-a")
    # Another owner takes the run behind worker-a's back (what a takeover does).
    with connection.cursor() as cur:
        cur.execute("UPDATE runs SET lease_owner = 'worker-b', lease_epoch = lease_epoch + 1 WHERE id = %s", [run.id])
    before = {t: t.objects.filter(run_id=run.id).count() for t in (ModelCall, ToolInvocation, Event)}
    outcome = execute_run(claim)
    assert outcome.kind.value == "fenced"
    after = {t: t.objects.filter(run_id=run.id).count() for t in (ModelCall, ToolInvocation, Event)}
    assert after[ModelCall] == before[ModelCall]
    assert after[ToolInvocation] == before[ToolInvocation]
    assert after[Event] == before[Event] + 1
    assert Event.objects.filter(run=run).order_by("-sequence").first().type == "run.fenced"
    row = reload(run)
    assert row.status == "RUNNING" and row.lease_owner == "worker-b"


def test_a_duplicate_drive_run_is_a_no_op(load_agent, submit, settings):
    # Room for a second lease of the tenant: the duplicate is refused by the claim's status guard, not by the
    # tenant's share (which alone would also refuse it, and hide a claim that took a leased run).
    settings.AGENTRT_TENANT_MAX_RUNNING = 0
    load_agent(turns=[echo_step("a"), {"text": "done"}])
    run = submit()
    claim = run_claim(run_id=run.id, owner="worker-a")
    assert claim is not None
    snapshot = (reload(run).updated_at, Event.objects.filter(run=run).count())
    assert run_drive(run_id=run.id) is None  # leased: the doorbell exits
    assert (reload(run).updated_at, Event.objects.filter(run=run).count()) == snapshot
    execute_run(claim)
    done = reload(run)
    assert done.status == "COMPLETED"
    assert run_drive(run_id=run.id) is None  # finished: also a no-op
    assert reload(run).updated_at == done.updated_at


def test_two_claims_racing_on_separate_connections_have_one_winner(load_agent, submit, settings):
    from django.db import connections

    load_agent()
    runs = [submit(text=f"r{i}") for i in range(20)]
    settings.AGENTRT_TENANT_MAX_RUNNING = len(runs)  # every run stays leased: a share that holds them all
    for run in runs:
        barrier = threading.Barrier(2)
        results = []

        def claim(owner, run_id, barrier, results):
            barrier.wait()
            try:
                results.append(run_claim(run_id=run_id, owner=owner))
            finally:
                connections.close_all()

        threads = [threading.Thread(target=claim, args=(f"w{i}", run.id, barrier, results)) for i in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert sum(1 for r in results if r is not None) == 1
        assert reload(run).lease_epoch == 1


def test_a_read_only_step_costs_two_commits(load_agent, submit):
    load_agent(turns=[echo_step(str(i)) for i in range(6)] + [{"text": "done"}], limits={"max_steps": 10})
    run = submit()
    claim = run_claim(run_id=run.id, owner="w")
    from runs.store import repository as store

    counted = []
    original, sending = store.DjangoRunStore.commit, store.DjangoRunStore.send

    def counting(self, work, **kw):
        counted.append(len(work.events))
        return original(self, work, **kw)

    def counting_sent(self, work):  # commit 1 of a read-only step, sent while the call runs
        counted.append(len(work.events))
        with patch.object(store.DjangoRunStore, "commit", original):
            return sending(self, work)

    store.DjangoRunStore.commit, store.DjangoRunStore.send = counting, counting_sent
    try:
        execute_run(claim)
    finally:
        store.DjangoRunStore.commit, store.DjangoRunStore.send = original, sending
    # 1 commit to start step 1, 2 per tool step (6 steps), the final step's answer rides with finalize (1).
    assert len(counted) == 1 + 2 * 6 + 1
    assert reload(run).status == "COMPLETED"


def test_http_post_sends_the_idempotency_key_after_its_watermark(load_agent, submit, settings):
    import http.server

    seen = []

    class Sink(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.append((self.headers["Idempotency-Key"], json.loads(body)))
            out = b'{"ok": true}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    settings.AGENTRT_HTTP_TOOL_ALLOWED_HOSTS = [f"127.0.0.1:{port}"]
    try:
        load_agent(
            turns=[
                {
                    "tool_calls": [
                        {"name": "http_post", "arguments": {"url": f"http://127.0.0.1:{port}/x", "json": {"a": 1}}},
                        {"name": "http_get", "arguments": {"url": "http://evil.example/"}},
                    ]
                },
                {"text": "sent"},
            ],
            tools=("http_post", "http_get"),
        )
        run = submit()
        run_drive(run_id=run.id)
    finally:
        server.shutdown()
    run = reload(run)
    assert run.status == "COMPLETED"
    post = ToolInvocation.objects.get(run=run, tool_name="http_post")
    assert post.effect_sent_at is not None and post.status == "completed" and post.attempt == 1
    assert seen == [(post.idempotency_key, {"a": 1})]
    assert post.idempotency_key == f"{run.id}:1:call_1_0"
    get = ToolInvocation.objects.get(run=run, tool_name="http_get")
    assert get.result["error"] == "host_not_allowed"
    order = events(run)
    assert order.index("tool.call.started") < order.index("tool.call.completed")
