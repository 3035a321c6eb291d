"""Timing around a run's slice: the adapters the loop calls (provider, tools,
store) are wrapped at the composition root, so the domain package stays
free of metrics, and the log context follows the step."""

from __future__ import annotations

import json
from dataclasses import replace

from opentelemetry import trace

from ops import tracing, worker_metrics
from ops.logs import log_context_update
from runs.clock import CLOCK
from runs.domain.context import RunContext
from runs.domain.errors import ModelError
from runs.domain.scrub import scrub


class _Proxy:
    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)


class TimedProvider(_Proxy):
    def complete(self, request, token):
        started = CLOCK.monotonic()
        outcome = "error"
        try:
            turn = self._inner.complete(request, token)
            outcome = "ok"
            return turn
        finally:
            worker_metrics.histograms()["model"].labels(outcome).observe(CLOCK.monotonic() - started)


class TimedTools(_Proxy):
    def execute(self, name, arguments, context):
        started = CLOCK.monotonic()
        try:
            return self._inner.execute(name, arguments, context)
        finally:
            worker_metrics.histograms()["tool"].labels(name).observe(CLOCK.monotonic() - started)


class TimedStore(_Proxy):
    def commit(self, *args, **kwargs):
        started = CLOCK.monotonic()
        try:
            return self._inner.commit(*args, **kwargs)
        finally:
            worker_metrics.histograms()["commit"].observe(CLOCK.monotonic() - started)

    def send(self, work):  # a unit in flight: the histogram gets send -> answered
        started = CLOCK.monotonic()
        sent = self._inner.send(work)
        sent.on_answer(lambda: worker_metrics.histograms()["commit"].observe(CLOCK.monotonic() - started))
        return sent

    def mark_effect_sent(self, *args, **kwargs):  # the watermark: a fenced transaction of its own
        started = CLOCK.monotonic()
        try:
            return self._inner.mark_effect_sent(*args, **kwargs)
        finally:
            worker_metrics.histograms()["commit"].observe(CLOCK.monotonic() - started)


class StepWatch:
    """Wraps the fault hook: the loop calls it at fixed points of a step,
    which is where a step starts (`model.before_call` of a new step number)
    and where a step with tool calls ends (`checkpoint.before_write`)."""

    def __init__(self, ctx, hook, timed: bool):
        self.ctx, self.hook, self.timed = ctx, hook, timed
        self.step: int | None = None
        self.started: float | None = None

    def __call__(self, point: str) -> None:
        if point == "model.before_call" and self.ctx.progress.current_step != self.step:
            self.step, self.started = self.ctx.progress.current_step, CLOCK.monotonic()
            log_context_update(step=self.step)
        elif point == "checkpoint.before_write":
            self.finish()
        self.hook(point)

    def close(self) -> None:
        """After `finalize`: the last step ends (its checkpoint is in finalize's commit)."""
        self.finish()
        self.ctx.tracer.end_step()

    def finish(self) -> None:
        if self.started is not None and self.timed:
            worker_metrics.histograms()["step"].observe(CLOCK.monotonic() - self.started)
        self.started = None


class TracedPolicy(_Proxy):
    def evaluate(self, tool_name, arguments):
        with tracing._tracer().start_as_current_span("policy.evaluate", attributes={"tool.name": tool_name}) as span:
            decision = self._inner.evaluate(tool_name, arguments)
            span.set_attribute("policy.decision", str(decision))
            return decision


class TracedProvider(_Proxy):
    """The model attempt's span (`chat {model}`, open while the provider runs) gets the GenAI usage and, on a
    failed attempt, `error.type` (the provider's classification). `gen_ai.response.model` is not set: the
    providers' turns do not carry the model that answered yet."""

    def complete(self, request, token):
        span = trace.get_current_span()
        try:
            turn = self._inner.complete(request, token)
        except ModelError as exc:
            span.set_attribute("error.type", exc.error_class)
            raise
        span.set_attribute("gen_ai.usage.input_tokens", turn.usage.input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", turn.usage.output_tokens)
        return turn


CONTENT_BYTES = 4096  # the most of a tool call's arguments or result a captured span carries


def _content(value) -> str:
    text = json.dumps(scrub(value), ensure_ascii=False, default=str)
    return text if len(text) <= CONTENT_BYTES else text[:CONTENT_BYTES] + "…"


class TracedTools(_Proxy):
    """`execute_tool {tool}` (GenAI conventions; the seed's `tool.execute` in `agentrt.span`)."""

    def execute(self, name, arguments, context):
        spec = self._inner.spec(name)
        attrs = {
            "tool.name": name,
            "agentrt.span": "tool.execute",
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.type": "function",
        }
        call_id = getattr(context, "call_id", None)
        if call_id:
            attrs["gen_ai.tool.call.id"] = str(call_id)
        if spec is not None:
            attrs.update({"tool.side_effect": spec.side_effect, "tool.read_only": spec.read_only})
        step = getattr(context, "step", None)
        if step is not None:
            attrs["step.number"] = step
        capture = tracing.capture_content()
        if capture:
            attrs["gen_ai.tool.call.arguments"] = _content(arguments)
        with tracing._tracer().start_as_current_span(f"execute_tool {name}", attributes=attrs) as span:
            result = self._inner.execute(name, arguments, context)
            if capture:
                span.set_attribute("gen_ai.tool.call.result", _content(result))
            return result


def _checkpoint_attrs(cp) -> dict:
    return {"checkpoint.version": cp.version, "checkpoint.full": bool(cp.full), "checkpoint.trigger": cp.trigger}


class TracedStore(_Proxy):
    def commit(self, work, *args, **kwargs):
        cp = getattr(work, "checkpoint", None)
        if cp is None:
            return self._inner.commit(work, *args, **kwargs)
        attrs = _checkpoint_attrs(cp)
        with tracing._tracer().start_as_current_span("checkpoint.save", attributes=attrs):
            return self._inner.commit(work, *args, **kwargs)

    def send(self, work):  # in flight: the span ends when the answer is in
        cp = getattr(work, "checkpoint", None)
        if cp is None:
            return self._inner.send(work)
        attrs = {**_checkpoint_attrs(cp), "checkpoint.overlapped": True}
        span = tracing._tracer().start_span("checkpoint.save", attributes=attrs)
        try:
            sent = self._inner.send(work)
        except BaseException:
            span.end()
            raise
        sent.on_answer(span.end)
        return sent


def instrument(ctx: RunContext) -> tuple[RunContext, StepWatch]:
    """Wrap the context's adapters (a new context: its ports are fixed for the
    run); return it with the step watch (finish it after `finalize`)."""
    if tracing.enabled():
        ctx = replace(
            ctx,
            tracer=tracing.RunTracer(run_id=ctx.run.id, epoch=ctx.run.lease_epoch, model=ctx.agent.model),
            provider=TracedProvider(ctx.provider),
            policy=TracedPolicy(ctx.policy),
            tools=TracedTools(ctx.tools),
            store=TracedStore(ctx.store),
        )
    timed = worker_metrics.enabled()
    if timed:
        ctx = replace(
            ctx, provider=TimedProvider(ctx.provider), tools=TimedTools(ctx.tools), store=TimedStore(ctx.store)
        )
    watch = StepWatch(ctx, ctx.fault, timed)
    ctx = replace(ctx, fault=watch)
    watch.ctx = ctx
    log_context_update(step=ctx.state.step + 1)  # the step this slice starts or re-enters
    return ctx, watch
