"""The deployment-wide Prometheus collector: read at scrape time from the
shared database (ops/fleet.py), so every web node shows the same totals."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from approvals.models import Approval
from ops import fleet
from runs.domain.values import RunStatus


def _histogram(name: str, doc: str, label: str, data: dict[str, fleet.Histogram]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=[label])
    for value, h in sorted(data.items()):
        family.add_metric([value], [(_bound(b), n) for b, n in h.buckets], h.total)
    return family


def _bound(b: float) -> str:
    return "+Inf" if b == float("inf") else repr(float(b))


def _counter(name: str, doc: str, label: str, data: dict[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=[label])
    for value, n in sorted(data.items()):
        family.add_metric([value], n)
    return family


def _mcp_calls(data: dict[str, int]) -> CounterMetricFamily:
    """`agent_mcp_calls_total{server,tool,outcome}` from the fleet's "mcp__<server>__<tool> <outcome>" labels."""
    family = CounterMetricFamily(
        "agent_mcp_calls",
        "Calls of MCP servers' tools that ran, by server, tool and outcome (succeeded, failed, uncertain).",
        labels=["server", "tool", "outcome"],
    )
    for label, n in sorted(data.items()):
        name, _, outcome = label.partition(" ")
        server, sep, tool = name.removeprefix("mcp__").partition("__")
        if name.startswith("mcp__") and sep and server and tool:
            family.add_metric([server, tool, outcome], n)
    return family


class DeploymentCollector(Collector):
    """The seven run series plus the fleet gauges."""

    def collect(self):
        c = fleet.deployment_counters()
        yield _histogram("agent_run_steps", "Steps per finished run, by terminal outcome.", "outcome", c["run_steps"])
        yield _counter("agent_runs_cancelled", "Runs that ended CANCELLED, by reason.", "reason", c["cancelled"])
        yield _counter(
            "agent_run_leases_lost",
            "Leases taken over from a worker that stopped renewing, by the phase it "
            "interrupted (side_effect: a sent call's outcome is unknown).",
            "phase",
            c["leases_lost"],
        )
        yield _counter("agent_runs_requeued", "Runs put back on the queue, by reason.", "reason", c["requeued"])
        yield _counter("agent_context_compactions", "Context compactions, by reason.", "reason", c["compactions"])
        yield _counter(
            "agent_tool_uncertain", "Tool calls whose outcome is unknown, by tool.", "tool", c["tool_uncertain"]
        )
        yield _mcp_calls(c["mcp_calls"])
        yield _histogram(
            "agent_run_waiting_seconds",
            "Time runs spent waiting, by suspension kind (observed when the wait ends).",
            "kind",
            c["waiting"],
        )

        s = fleet.fleet_snapshot()
        runs = GaugeMetricFamily("agent_runs", "Runs by status.", labels=["status"])
        by_status = {status.value: 0 for status in RunStatus} | dict(s["runs_by_status"])  # every status from the start
        for status, n in sorted(by_status.items()):
            runs.add_metric([status], n)
        yield runs
        yield GaugeMetricFamily("agent_queue_depth", "Runs QUEUED.", value=s["queue"]["depth"])
        yield GaugeMetricFamily(
            "agent_queue_oldest_age_seconds",
            "Age of the oldest QUEUED run (0 when none).",
            value=s["queue"]["oldest_age_seconds"],
        )
        yield GaugeMetricFamily(
            "agent_workers_live",
            "Worker processes of the qcluster nodes up now, idle or busy (django-q2's cluster status).",
            value=s["live_workers"],
        )
        yield GaugeMetricFamily("agent_workers_busy", "Worker processes renewing a lease now.", value=s["busy_workers"])
        pending = GaugeMetricFamily("agent_approvals_pending", "Pending approvals, by kind.", labels=["kind"])
        oldest = GaugeMetricFamily(
            "agent_approval_oldest_pending_age_seconds", "Age of the oldest pending approval, by kind.", labels=["kind"]
        )
        approvals = {kind: {"pending": 0, "oldest_age_seconds": 0} for kind, _ in Approval.KINDS} | dict(s["approvals"])
        for kind, a in sorted(approvals.items()):
            pending.add_metric([kind], a["pending"])
            oldest.add_metric([kind], a["oldest_age_seconds"])
        yield pending
        yield oldest


def deployment_registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DeploymentCollector())
    return registry
