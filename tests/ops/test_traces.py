"""Seed 002's span tree, collected by the OpenTelemetry SDK's in-memory
exporter, for a run with tool calls, a compaction and an approval; the
submit and both execution slices (before and after the approval) are one
trace. With tracing off the loop keeps its null tracer."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from approvals.models import Approval
from approvals.services import approval_decide
from ops import tracing
from runs.domain.tracing import NullTracer
from runs.models import Event, Run
from runs.runtime.executor import run_drive
from runs.runtime.wiring import build_context

pytestmark = pytest.mark.django_db


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    yield exporter
    tracing.use_provider(None)


def seed_name(span) -> str:
    """The seed's name of a span: the three GenAI-named ones keep it in `agentrt.span`."""
    return span.attributes.get("agentrt.span", span.name)


def children(all_spans, parent, name):
    return [
        s
        for s in all_spans
        if seed_name(s) == name and s.parent is not None and s.parent.span_id == parent.context.span_id
    ]


def test_a_run_with_tools_a_compaction_and_an_approval_is_one_trace_of_the_seed_tree(
    spans, load_agent, submit, operator
):
    turns = [{"tool_calls": [{"name": "echo", "arguments": {"text": f"{i}:" + "x" * 800}}]} for i in range(8)]
    turns += [{"tool_calls": [{"name": "echo", "arguments": {"text": "deploy"}}]}, {"text": "done"}]
    load_agent(
        model={"provider": "scripted", "turns": turns, "context_window": 2000},
        policy={
            "default": "allow",
            "rules": [
                {"tool": "echo", "decision": "require_approval", "when": {"arg": "text", "op": "eq", "value": "deploy"}}
            ],
        },
        limits={"max_steps": 20, "max_tool_calls": 30},
    )
    run = submit()
    assert Event.objects.get(run=run, type="run.created").payload["traceparent"].startswith("00-")
    assert run_drive(run_id=run.id).kind.value == "suspended"
    approval = Approval.objects.get(run=run, status="pending")
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash, via="api")
    assert run_drive(run_id=run.id).kind.value == "completed"
    assert Event.objects.filter(run=run, type="context.compacted").exists()

    got = spans.get_finished_spans()
    assert len({s.context.trace_id for s in got}) == 1, "submit and every slice are one trace"
    (submit_span,) = [s for s in got if s.name == "run.submit"]
    slices = children(got, submit_span, "agent.run")
    assert len(slices) == 2 and [s.name for s in got if seed_name(s) == "agent.run"] == ["invoke_agent bot"] * 2
    assert all(s.attributes["run.id"] == str(run.id) for s in slices)
    # OpenTelemetry's GenAI conventions on the slice, the model attempts and the tool calls
    assert all(
        s.attributes["gen_ai.operation.name"] == "invoke_agent"
        and s.attributes["gen_ai.agent.name"] == "bot"
        and s.attributes["gen_ai.agent.version"] == run.agent_version
        and s.attributes["gen_ai.conversation.id"] == str(run.session_id)
        for s in slices
    )

    steps = [st for sl in slices for st in children(got, sl, "run.step")]
    step_count = Run.objects.get(id=run.id).step_count
    assert {s.attributes["step.number"] for s in steps} == set(range(1, step_count + 1))
    # The slice after the approval re-enters the paused step's batch: that step again, marked, with no model call.
    (reentry,) = [s for s in steps if s.attributes.get("step.resumed_batch")]
    assert not children(got, reentry, "model.invoke") and children(got, reentry, "tool.execute")
    model_steps = [s for s in steps if children(got, s, "model.invoke")]
    assert len(model_steps) == Run.objects.get(id=run.id).step_count
    for step in model_steps:
        assert len(step.attributes["context.prefix_sha256"]) == 64 and step.attributes["step.attempt_count"] >= 1
        assert step.attributes["run.epoch"] >= 1
        builds = sorted(children(got, step, "context.build"), key=lambda s: s.start_time)
        assert len(builds) == 1 + len(children(got, step, "context.compact"))  # measured, compacted, built again
        assert builds[-1].attributes["context.prefix_sha256"] == step.attributes["context.prefix_sha256"]
        (invoke,) = children(got, step, "model.invoke")
        assert len(children(got, invoke, "model.attempt")) == step.attributes["step.attempt_count"]
        assert children(got, step, "checkpoint.save")
    compacted = [s for s in steps if children(got, s, "context.compact")]
    assert compacted and all(s.attributes["step.compactions"] >= 1 for s in compacted)
    attempts = [a for s in got if seed_name(s) == "model.attempt" for a in [s]]
    assert attempts and all(
        a.name == "chat scripted"
        and a.kind is SpanKind.CLIENT
        and a.attributes["gen_ai.operation.name"] == "chat"
        and a.attributes["gen_ai.provider.name"] == "scripted"
        and a.attributes["gen_ai.request.model"] == "scripted"
        and a.attributes["gen_ai.usage.input_tokens"] >= 0
        and a.attributes["gen_ai.usage.output_tokens"] >= 0
        for a in attempts
    )
    tools = [t for s in steps for t in children(got, s, "tool.execute")]
    assert len(tools) == 9 and {t.attributes["tool.name"] for t in tools} == {"echo"}
    assert {t.name for t in tools} == {"execute_tool echo"}
    assert all(
        t.attributes["gen_ai.operation.name"] == "execute_tool"
        and t.attributes["gen_ai.tool.name"] == "echo"
        and t.attributes["gen_ai.tool.call.id"]
        and "gen_ai.tool.call.arguments" not in t.attributes  # content capture is off by default
        for t in tools
    )
    assert all(t.attributes["tool.side_effect"] == "none" and t.attributes["tool.read_only"] is True for t in tools)
    decisions = [p.attributes["policy.decision"] for s in steps for p in children(got, s, "policy.evaluate")]
    assert "require_approval" in decisions and "allow" in decisions
    assert {seed_name(s) for s in got} == {
        "run.submit",
        "agent.run",
        "run.step",
        "context.build",
        "context.compact",
        "model.invoke",
        "model.attempt",
        "policy.evaluate",
        "tool.execute",
        "checkpoint.save",
    }


def test_without_a_provider_the_loop_keeps_the_null_tracer(load_agent, submit):
    load_agent()
    run = submit()
    assert "traceparent" not in Event.objects.get(run=run, type="run.created").payload
    from ops.instrument import instrument
    from runs.domain.cancellation import Token
    from runs.runtime.queue import run_claim

    claim = run_claim(run_id=run.id, owner="test:1:abc")
    ctx = build_context(claim, token=Token(), lease=None)
    ctx, _ = instrument(ctx)
    assert isinstance(ctx.tracer, NullTracer)


class _Collector:
    """A local OTLP/HTTP receiver: keeps every span POSTed to /v1/traces."""

    def __init__(self):
        import http.server
        import threading

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        self.spans = []
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for rs in request.resource_spans:
                    for ss in rs.scope_spans:
                        collector.spans.extend(ss.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


@pytest.mark.django_db(transaction=True)
def test_a_worker_process_exports_its_spans_over_otlp_in_the_submits_trace(spans, cluster, load_agent, submit):
    """Real `qcluster` with OTEL_EXPORTER_OTLP_ENDPOINT: the worker's spans reach the receiver and continue
    the trace the submit (this process) started."""
    from tests.conftest import wait_for

    collector = _Collector()
    try:
        load_agent(turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}]}, {"text": "done"}])
        cluster(
            OTEL_EXPORTER_OTLP_ENDPOINT=collector.url, OTEL_BSP_SCHEDULE_DELAY="100", OTEL_SERVICE_NAME="agentrt-worker"
        )
        run = submit()
        (submit_span,) = [s for s in spans.get_finished_spans() if s.name == "run.submit"]
        wait_for(lambda: Run.objects.get(id=run.id).status == "COMPLETED", timeout=60, message="the run to complete")
        wait_for(
            lambda: (
                any(s.name == "checkpoint.save" for s in collector.spans)
                and any(s.name == "invoke_agent bot" for s in collector.spans)
            ),
            timeout=30,
            message="the worker's spans",
        )
        (slice_,) = [s for s in collector.spans if s.name == "invoke_agent bot"]
        assert slice_.trace_id == submit_span.context.trace_id.to_bytes(16, "big")
        assert slice_.parent_span_id == submit_span.context.span_id.to_bytes(8, "big")
        names = {s.name for s in collector.spans}
        assert {
            "run.step",
            "context.build",
            "model.invoke",
            "chat scripted",
            "policy.evaluate",
            "execute_tool echo",
            "checkpoint.save",
        } <= names
        assert {s.trace_id for s in collector.spans} == {slice_.trace_id}
    finally:
        collector.close()


def test_tool_content_is_captured_only_when_asked_and_scrubbed(spans, load_agent, submit, monkeypatch):
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    secret = "sk-" + "A" * 24
    load_agent(turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": f"key {secret}"}}]}, {"text": "done"}])
    run = submit()
    assert run_drive(run_id=run.id).kind.value == "completed"
    (tool,) = [s for s in spans.get_finished_spans() if seed_name(s) == "tool.execute"]
    assert tool.attributes["gen_ai.tool.call.arguments"] == '{"text": "key [REDACTED]"}'
    assert tool.attributes["gen_ai.tool.call.result"] == '"key [REDACTED]"'
    assert all(secret not in str(dict(s.attributes)) for s in spans.get_finished_spans())
