"""`/metrics` on two real web nodes (daphne) after real runs on a real
cluster (`qcluster` + `run_maintenance`): seed 002's series move, both nodes
show the same deployment-wide figures, the bearer token is enforced, the
worker node serves its per-process histograms on AGENTRT_METRICS_PORT, and
the worker's JSON log lines parse and carry the run id."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from approvals.models import Approval
from approvals.services import approval_decide
from runs.models import Event, Run
from runs.services.lifecycle import run_cancel
from tests.conftest import free_port, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

LEASE = 2.0
TOKEN = "s3cret-scrape-token"


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture
def web_nodes(procs, tmp_path):
    """Two web nodes on one database: A open, B behind AGENTRT_METRICS_TOKEN."""
    a, b = free_port(), free_port()
    # daphne writes its access log itself (Common Log Format, not through logging): in JSON mode it goes to its own
    # file.
    procs(
        [
            "-m",
            "daphne",
            "-b",
            "127.0.0.1",
            "-p",
            str(a),
            "--access-log",
            str(tmp_path / "web-a.access.log"),
            "agentrt_site.asgi:application",
        ],
        "web-a",
        AGENTRT_LOG_FORMAT="json",
        AGENTRT_LOG_LEVEL="INFO",
    )
    procs(
        ["-m", "daphne", "-b", "127.0.0.1", "-p", str(b), "agentrt_site.asgi:application"],
        "web-b",
        AGENTRT_METRICS_TOKEN=TOKEN,
    )
    wait_for(lambda: listening(a) and listening(b), timeout=30, message="both web nodes to listen")
    return f"http://127.0.0.1:{a}", f"http://127.0.0.1:{b}"


def get(url, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def samples(text: str) -> dict[tuple, float]:
    """{(sample name, sorted labels): value} of a Prometheus text exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def scrape(base, token=None) -> dict[tuple, float]:
    status, body = get(base + "/metrics", {"Authorization": f"Bearer {token}"} if token else None)
    assert status == 200, body
    return samples(body)


def value(m, name, **labels) -> float:
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


def status(run) -> str:
    return Run.objects.filter(id=run.id).values_list("status", flat=True).get()


def test_metrics_move_with_real_runs_and_every_web_node_shows_the_same_totals(
    web_nodes, procs, cluster, load_agent, submit, sink, operator, tmp_path
):
    node_a, node_b = web_nodes

    # The token: node B refuses a scrape without it, with a wrong one, or with another scheme.
    assert get(node_b + "/metrics")[0] == 401
    assert get(node_b + "/metrics", {"Authorization": "Bearer wrong"})[0] == 401
    assert get(node_b + "/metrics", {"Authorization": f"Token {TOKEN}"})[0] == 401
    assert get(node_b + "/metrics", {"Authorization": f"Bearer {TOKEN}"})[0] == 200

    load_agent(name="slow", turns=[{"text": "slept", "delay_ms": 2500}])
    load_agent(
        name="payer",
        tools=("http_post",),
        turns=[
            {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": 5}}}]},
            {"text": "paid"},
        ],
    )
    load_agent(
        name="asker",
        tools=("echo",),
        policy={"default": "allow", "rules": [{"tool": "echo", "decision": "require_approval"}]},
        turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "may I"}}]}, {"text": "ok"}],
    )
    turns = [{"tool_calls": [{"name": "echo", "arguments": {"text": f"{i}:" + "x" * 400}}]} for i in range(8)] + [
        {"text": "all read"}
    ]
    load_agent(
        name="reader",
        model={"provider": "scripted", "turns": turns, "context_window": 2000},
        limits={"max_steps": 20, "max_tool_calls": 30},
    )

    # Before any worker runs: the queue and its oldest run's age.
    slow = submit(agent="slow")
    wait_for(lambda: value(scrape(node_a), "agent_queue_oldest_age_seconds") > 0, timeout=20, message="the queue's age")
    m = scrape(node_a)
    assert value(m, "agent_queue_depth") == 1 and value(m, "agent_runs", status="QUEUED") == 1

    metrics_port = free_port()
    env = dict(
        AGENTRT_LEASE_SECONDS=LEASE,
        AGENTRT_WORKERS=2,
        AGENTRT_ENABLE_FAULTPOINTS=1,
        AGENTRT_FAULTPOINTS="tool.after_watermark=kill",
        AGENTRT_FAULTPOINT_DIR=tmp_path,
        AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host,
        AGENTRT_LOG_FORMAT="json",
        AGENTRT_LOG_LEVEL="INFO",
    )
    c = cluster(AGENTRT_METRICS_PORT=metrics_port, **env)
    procs(["manage.py", "run_maintenance"], "maintenance", **env)

    # A live worker is one renewing a lease: the slow run's.
    wait_for(lambda: value(scrape(node_a), "agent_workers_live") >= 1, timeout=30, message="a live worker")
    wait_for(lambda: status(slow) == "COMPLETED", timeout=60, message=f"the slow run\n{c.output()[-2000:]}")

    # A worker killed after the watermark: the lease is taken over with the
    # phase `side_effect`, and the run waits on an interrupted_side_effect approval.
    payer = submit(agent="payer")
    wait_for(
        lambda: status(payer) == "WAITING_FOR_APPROVAL", timeout=90, message=f"the payer to park\n{c.output()[-3000:]}"
    )
    m = scrape(node_a)
    assert value(m, "agent_run_leases_lost_total", phase="side_effect") >= 1
    assert value(m, "agent_approvals_pending", kind="interrupted_side_effect") == 1
    assert value(m, "agent_approval_oldest_pending_age_seconds", kind="interrupted_side_effect") >= 0
    assert value(m, "agent_runs", status="WAITING_FOR_APPROVAL") == 1
    approval = Approval.objects.get(run=payer, status="pending")
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash, via="api")
    wait_for(lambda: status(payer) == "COMPLETED", timeout=60, message="the payer to complete after approval")

    # A policy pause, then a cancel.
    asker = submit(agent="asker")
    wait_for(lambda: status(asker) == "WAITING_FOR_APPROVAL", timeout=60, message="the asker to pause")
    assert value(scrape(node_a), "agent_approvals_pending", kind="policy") == 1
    run_cancel(run=Run.objects.get(id=asker.id), by="alice")

    # A long conversation: compacted.
    reader = submit(agent="reader")
    wait_for(lambda: status(reader) == "COMPLETED", timeout=90, message="the reader to complete")

    a, b = scrape(node_a), scrape(node_b, TOKEN)
    deployment = {k: v for k, v in a.items() if k[0].startswith("agent_") and "age_seconds" not in k[0]}
    assert deployment == {k: v for k, v in b.items() if k in deployment}, "both web nodes show the same totals"

    assert value(a, "agent_run_steps_count", outcome="completed") == 3
    assert value(a, "agent_run_steps_sum", outcome="completed") == sum(
        Run.objects.filter(status="COMPLETED").values_list("step_count", flat=True)
    )
    assert value(a, "agent_run_steps_count", outcome="cancelled") == 1
    assert value(a, "agent_run_steps_bucket", outcome="completed", le="1.0") == 1  # the slow run: one step
    assert value(a, "agent_runs_cancelled_total", reason="requested") == 1
    assert value(a, "agent_run_leases_lost_total", phase="side_effect") == 1
    assert value(a, "agent_runs_requeued_total", reason="approval") >= 1
    assert (
        value(a, "agent_context_compactions_total", reason="pressure")
        == Event.objects.filter(type="context.compacted").count()
        >= 1
    )
    assert (
        value(a, "agent_run_waiting_seconds_count", kind="approval") == 2
    )  # the payer's (approved) and the asker's (cancelled)
    assert value(a, "agent_run_waiting_seconds_sum", kind="approval") > 0
    assert value(a, "agent_run_waiting_seconds_bucket", kind="approval", le="+Inf") == 2
    assert "# TYPE agent_tool_uncertain_total counter" in get(node_a + "/metrics")[1]  # moved by the next test
    assert value(a, "agent_runs", status="COMPLETED") == 3 and value(a, "agent_runs", status="CANCELLED") == 1
    assert value(a, "agent_queue_depth") == 0 and value(a, "agent_approvals_pending", kind="policy") == 0

    # The worker node's own histograms, summed over its forked workers (one of them was killed).
    status_code, body = get(f"http://127.0.0.1:{metrics_port}/metrics")
    assert status_code == 200
    w = samples(body)
    assert value(w, "agent_model_call_seconds_count", outcome="ok") >= 12
    assert value(w, "agent_tool_call_seconds_count", tool="echo") >= 8
    assert value(w, "agent_tool_call_seconds_count", tool="http_post") >= 1
    assert value(w, "agent_step_seconds_count") >= 10
    assert value(w, "agent_commit_seconds_count") >= 20

    # JSON logs: every line of the worker node's output is one object; the run's lines carry its id.
    lines = [line for line in c.output().splitlines() if line.strip()]
    parsed = [json.loads(line) for line in lines]
    mine = [p for p in parsed if p.get("run") == str(payer.id)]
    assert mine and all(p["tenant"] == str(payer.tenant_id) and "worker" in p and "epoch" in p for p in mine)
    assert {p.get("step") for p in mine} >= {1, 2}
    # ... and so does every other process of the deployment that logs JSON: a web node, maintenance (the takeover).
    for name in ("web-a", "maintenance"):
        other = [json.loads(line) for line in (tmp_path / f"{name}.log").read_text().splitlines() if line.strip()]
        assert other and all({"ts", "level", "logger", "message"} <= set(p) for p in other), name


def test_an_unanswered_side_effect_moves_agent_tool_uncertain_total(cluster, load_agent, submit, sink):
    """A POST whose connection closes without an answer: its outcome is unknown (the invocation outcome
    `uncertain`), the run parks, and the counter says which tool."""
    from django.test import Client

    sink.behaviours = ["close"]
    load_agent(
        name="unsure",
        tools=("http_post",),
        turns=[
            {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": 5}}}]},
            {"text": "paid"},
        ],
    )
    cluster(AGENTRT_LEASE_SECONDS=3, AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host)
    run = submit(agent="unsure")
    wait_for(
        lambda: status(run) == "WAITING_FOR_APPROVAL", timeout=60, message="the run to park on its unknown outcome"
    )
    m = samples(Client(HTTP_HOST="127.0.0.1").get("/metrics").content.decode())
    assert value(m, "agent_tool_uncertain_total", tool="http_post") == 1
    assert value(m, "agent_approvals_pending", kind="uncertain_side_effect") == 1
    from runs.services.selectors import tool_uncertain_counts

    assert tool_uncertain_counts() == {"http_post": 1}  # the same figure the runs app's selector gives
