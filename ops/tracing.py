"""OpenTelemetry traces of the run's span tree, across processes.

`run_submit` records a `run.submit` span and stores its W3C `traceparent` in
the run's `run.created` event; every execution slice (`agent.run`, on
whatever worker) continues that trace, so submit and execution are one
trace. Inside a slice the loop opens `run.step`, `context.build`,
`context.compact`, `model.invoke` and `model.attempt` through the domain's
Tracer port; the adapters add `policy.evaluate`, `tool.execute` and
`checkpoint.save` (ops/instrument.py).

Three of those spans carry OpenTelemetry's GenAI semantic conventions
(development version), the names LLM-observability tools read: the slice is
`invoke_agent {agent}`, a model attempt `chat {model}` (kind CLIENT), a tool
call `execute_tool {tool}`, each with its `gen_ai.*` attributes; the seed's
name stays on each as the attribute `agentrt.span` (and the tree is the
seed's). Message and tool content is captured only when
`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT` is true, and then
scrubbed and bounded like every persisted result.

Exported over OTLP/HTTP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (the
SDK reads the standard OTEL_* variables). Unset, nothing is configured and
the loop keeps its null tracer: no span object is created at all.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from django.db import DatabaseError
from opentelemetry import context, trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from runs.models import Event

_state: dict[str, Any] = {"provider": None}


def configure() -> None:
    """Install the OTLP exporter when the endpoint is set (each process, at start)."""
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or _state["provider"] is not None:
        return
    # the SDK and its exporter load only in a process that exports traces
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(
        resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "agentrt")})
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))  # its thread is re-created after a fork
    use_provider(provider)


def use_provider(provider) -> None:
    """Trace with this SDK provider (configure() or a test's in-memory one); None turns tracing off."""
    _state["provider"] = provider


def enabled() -> bool:
    return _state["provider"] is not None


def capture_content() -> bool:
    """GenAI content capture (tool arguments and results on `execute_tool`): off unless the standard variable
    asks for it — it may hold personal data."""
    return os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "").strip().lower() in ("1", "true")


def model_names(model: dict | None) -> tuple[str, str]:
    """(gen_ai.provider.name, gen_ai.request.model) of an agent's `model` block."""
    model = model or {}
    provider = str(model.get("provider") or "unknown")
    return provider, str(model.get("model") or provider)


def _tracer():
    return _state["provider"].get_tracer("agentrt")


def submit_context(run_id) -> dict:
    """Record `run.submit` and return what to store on the run: {"traceparent": ...}, or {} when off."""
    if not enabled():
        return {}

    carrier: dict[str, str] = {}
    with _tracer().start_as_current_span("run.submit", attributes={"run.id": str(run_id)}) as span:
        TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(span))
    return {"traceparent": carrier["traceparent"]} if "traceparent" in carrier else {}


@contextlib.contextmanager
def run_span(claim):
    """`agent.run` for one execution slice, in the submit's trace."""
    if not enabled():
        yield None
        return

    try:
        created = (
            Event.objects.filter(run_id=claim.run_id, type="run.created").values_list("payload", flat=True).first()
            or {}
        )
    except DatabaseError:  # a trace must never stop a run: this slice starts its own trace
        created = {}
    parent = (
        TraceContextTextMapPropagator().extract({"traceparent": created["traceparent"]})
        if created.get("traceparent")
        else None
    )
    agent = str(created.get("agent") or "agent")
    attributes = {
        "run.id": str(claim.run_id),
        "run.epoch": claim.epoch,
        "worker": claim.owner,
        "agentrt.span": "agent.run",
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": agent,
        "gen_ai.conversation.id": str(claim.session_id),
    }
    if created.get("agent_version"):
        attributes["gen_ai.agent.version"] = str(created["agent_version"])
    with _tracer().start_as_current_span(f"invoke_agent {agent}", context=parent, attributes=attributes) as span:
        yield span


class _Span:
    def __init__(self, span):
        self._span = span

    def set(self, key: str, value: Any) -> None:
        if value is not None:
            self._span.set_attribute(key, value)


class RunTracer:
    """The domain's Tracer port on the OpenTelemetry SDK, for one slice."""

    def __init__(self, *, run_id, epoch: int, model: dict | None = None):
        self._tracer = _tracer()
        self._base = {"run.id": str(run_id), "run.epoch": epoch}
        self._provider, self._model = model_names(model)
        self._step: Any = None
        self._step_ctx: Any = None
        self._token: Any = None

    @contextlib.contextmanager
    def span(self, name: str, attributes: dict | None = None, *, under: str | None = None):
        parent = self._step_ctx if under == "step" else None
        attrs = {**self._base, **{k: v for k, v in (attributes or {}).items() if v is not None}}
        shown, kind = name, trace.SpanKind.INTERNAL
        if name == "model.attempt":  # a model call in the GenAI conventions: `{operation} {model}`, a client span
            shown, kind = f"chat {self._model}", trace.SpanKind.CLIENT
            attrs.update(
                {
                    "agentrt.span": name,
                    "gen_ai.operation.name": "chat",
                    "gen_ai.provider.name": self._provider,
                    "gen_ai.request.model": self._model,
                }
            )
        with self._tracer.start_as_current_span(shown, context=parent, attributes=attrs, kind=kind) as span:
            yield _Span(span)

    def begin_step(self, step_number: int, attributes: dict | None = None) -> None:
        self.end_step()
        self._step = self._tracer.start_span(
            "run.step", attributes={**self._base, "step.number": step_number, **(attributes or {})}
        )
        self._step_ctx = trace.set_span_in_context(self._step)
        self._token = context.attach(self._step_ctx)

    def set_step(self, key: str, value: Any) -> None:
        if self._step is not None and value is not None:
            self._step.set_attribute(key, value)

    def end_step(self) -> None:
        if self._step is None:
            return
        context.detach(self._token)
        self._step.end()
        self._step = self._step_ctx = self._token = None
