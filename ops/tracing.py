"""OpenTelemetry traces of seed 002's tree, across processes.

`run_submit` records a `run.submit` span and stores its W3C `traceparent` in
the run's `run.created` event; every execution slice (`agent.run`, on
whatever worker) continues that trace, so submit and execution are one
trace. Inside a slice the loop opens `run.step`, `context.build`,
`context.compact`, `model.invoke` and `model.attempt` through the domain's
Tracer port; the adapters add `policy.evaluate`, `tool.execute` and
`checkpoint.save` (ops/instrument.py).

Exported over OTLP/HTTP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (the
SDK reads the standard OTEL_* variables). Unset, nothing is configured and
the loop keeps its null tracer: no span object is created at all.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

_state: dict[str, Any] = {"provider": None}


def configure() -> None:
    """Install the OTLP exporter when the endpoint is set (each process, at start)."""
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or _state["provider"] is not None:
        return
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


def _tracer():
    return _state["provider"].get_tracer("agentrt")


def submit_context(run_id) -> dict:
    """Record `run.submit` and return what to store on the run: {"traceparent": ...}, or {} when off."""
    if not enabled():
        return {}
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

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
    from django.db import DatabaseError
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from runs.models import Event

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
    attributes = {"run.id": str(claim.run_id), "run.epoch": claim.epoch, "worker": claim.owner}
    with _tracer().start_as_current_span("agent.run", context=parent, attributes=attributes) as span:
        yield span


class _Span:
    def __init__(self, span):
        self._span = span

    def set(self, key: str, value: Any) -> None:
        if value is not None:
            self._span.set_attribute(key, value)


class RunTracer:
    """The domain's Tracer port on the OpenTelemetry SDK, for one slice."""

    def __init__(self, *, run_id, epoch: int):
        self._tracer = _tracer()
        self._base = {"run.id": str(run_id), "run.epoch": epoch}
        self._step = None
        self._step_ctx = None
        self._token = None

    @contextlib.contextmanager
    def span(self, name: str, attributes: dict | None = None, *, under: str | None = None):
        parent = self._step_ctx if under == "step" else None
        attrs = {**self._base, **{k: v for k, v in (attributes or {}).items() if v is not None}}
        with self._tracer.start_as_current_span(name, context=parent, attributes=attrs) as span:
            yield _Span(span)

    def begin_step(self, step_number: int, attributes: dict | None = None) -> None:
        from opentelemetry import context, trace

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
        from opentelemetry import context

        if self._step is None:
            return
        context.detach(self._token)
        self._step.end()
        self._step = self._step_ctx = self._token = None
