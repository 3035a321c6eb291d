"""What the loop's tracing calls cost per step, off and on.

    .venv/bin/python bench/tracing_overhead.py [--steps 200000]

Per step the loop makes the same Tracer-port calls whatever the tracer:
begin_step, three spans (context.build, model.invoke, model.attempt) and
four set_step. Off (no OTEL_EXPORTER_OTLP_ENDPOINT) it holds the domain's
NullTracer; on, ops.tracing.RunTracer on the SDK with a batch processor and
an exporter that drops spans (the export itself runs on the processor's
thread). No database, no Django: the port calls alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def one_step(tracer, n: int) -> None:
    tracer.begin_step(n)
    with tracer.span("context.build", {"step.number": n}, under="step") as s:
        s.set("context.prefix_sha256", "0" * 64)
    with tracer.span("model.invoke", {"step.number": n}):
        tracer.set_step("step.attempt_count", 1)
        tracer.set_step("context.prefix_sha256", "0" * 64)
        with tracer.span("model.attempt", {"attempt.number": 1}):
            pass
    tracer.set_step("step.tool_call_count", 1)
    tracer.end_step()


def per_step_ns(tracer, steps: int) -> float:
    rounds = []
    for _ in range(5):
        started = time.perf_counter_ns()
        for n in range(steps):
            one_step(tracer, n)
        rounds.append((time.perf_counter_ns() - started) / steps)
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200_000)
    args = parser.parse_args()
    # here, not at the top: the project's modules import once sys.path holds the repository (above)
    from runs.domain.tracing import NullTracer

    off = per_step_ns(NullTracer(), args.steps)

    # the SDK is loaded for the traced measurement only, after the untraced one
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    # as above: once sys.path holds the repository
    from ops import tracing

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop(), max_queue_size=1_000_000))
    tracing.use_provider(provider)
    on = per_step_ns(tracing.RunTracer(run_id=uuid.uuid4(), epoch=1), max(1, args.steps // 20))
    provider.shutdown()
    print(f"tracing off (NullTracer): {off:.0f} ns/step; on (SDK, batch processor): {on / 1000:.1f} us/step")


if __name__ == "__main__":
    main()
