"""The Grafana dashboard (deploy/grafana/agentrt.json) queries only series
agentrt exports, and every seed 002 series has a panel."""

import json
import re

from tests.conftest import ROOT

DEPLOYMENT = {
    "agent_run_steps",
    "agent_runs_cancelled_total",
    "agent_run_leases_lost_total",
    "agent_runs_requeued_total",
    "agent_context_compactions_total",
    "agent_tool_uncertain_total",
    "agent_run_waiting_seconds",
    "agent_runs",
    "agent_queue_depth",
    "agent_queue_oldest_age_seconds",
    "agent_workers_live",
    "agent_approvals_pending",
    "agent_approval_oldest_pending_age_seconds",
}
WORKER = {"agent_step_seconds", "agent_model_call_seconds", "agent_tool_call_seconds", "agent_commit_seconds"}


def test_the_dashboard_uses_exported_series_and_covers_seed_002():
    dash = json.loads((ROOT / "deploy" / "grafana" / "agentrt.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {re.sub(r"_(bucket|count|sum)$", "", name) for e in exprs for name in re.findall(r"\bagent_[a-z_]+", e)}
    assert used <= DEPLOYMENT | WORKER, used - DEPLOYMENT - WORKER
    assert used == DEPLOYMENT | WORKER
