"""Property-based run of the whole API from its own OpenAPI document
(schemathesis over the WSGI app, authenticated as a real tenant operator).

Per operation: schema-valid cases, schema-violating cases, and seeded cases
whose ids and bodies name real objects (so that operations which can succeed
do). Every answer must be below 500, match the documented status codes,
content types and response schemas; negative data must be refused. The 2xx
count per operation is printed (run with -s) and must be > 0 for every
operation.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.db import connection
from hypothesis import HealthCheck, Phase, given, settings
from knox.models import AuthToken
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from approvals.models import Approval
from runs.models import Run
from runs.runtime.queue import run_claim
from runs.services import run_submit
from tests.api.conftest import WEBHOOK_URL, agent_definitions, webhook_world

# 21 operations (7 are /api/webhooks/): 635 s measured at load average 17 on the 2-core VM
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(900)]

EXAMPLES = {"positive": 40, "negative": 40, "seeded": 10}
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def submit_driven(tenant, agent):
    from runs.runtime.executor import run_drive

    run, _ = run_submit(tenant=tenant, agent=agent, input="hello")
    run_drive(run_id=run.id)
    return Run.objects.get(id=run.id)


def seeds(world, tenant):
    """Fixed path parameters and bodies, per operation, that name real objects."""
    running = run_submit(tenant=tenant, agent="bot", input="spin")[0]
    run_claim(run_id=running.id, owner="schemathesis-live-worker")  # live lease: cancel is 202 every time
    dead = run_submit(tenant=tenant, agent="bot", input="dead")[0]
    run_claim(run_id=dead.id, owner="schemathesis-dead-worker")
    with connection.cursor() as cur:  # test-only: the worker died, its lease lapsed
        cur.execute("UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = %s", [dead.id])
    rejectable = Approval.objects.get(run=submit_driven(tenant, "approver"))
    confirmable = uncertain_approval(tenant)
    retryable = failed_transiently(tenant)  # the first retry is 202, the next ones 409 run_not_failed
    agent = dict(agent_definitions()[0], name="fuzzed")
    doomed, _ = webhook_world(tenant, world.done)  # the one DELETE removes
    by_id = lambda run: {"id": str(run.id)}  # noqa: E731
    pair = {"id": str(world.done.id), "other": str(world.queued.id)}  # two runs to compare
    return {
        "GET /api/agents/": {},
        "POST /api/agents/": {"body": agent},
        "GET /api/runs/": {},
        "POST /api/runs/": {"body": {"agent": "bot", "input": "hello"}},
        "GET /api/runs/{id}/": {"path_parameters": by_id(world.done)},
        "GET /api/runs/{id}/events/": {"path_parameters": by_id(world.done)},
        "POST /api/runs/{id}/cancel/": {"path_parameters": by_id(running)},
        "POST /api/runs/{id}/resume/": {"path_parameters": by_id(dead)},
        "POST /api/runs/{id}/retry/": {"path_parameters": by_id(retryable)},
        "POST /api/runs/{id}/input/": {"path_parameters": by_id(world.asking), "body": {"text": "eu-west"}},
        "POST /api/runs/{id}/fork/": {"path_parameters": by_id(world.done), "body": {"from_step": 0}},
        "POST /api/runs/{id}/replay/": {"path_parameters": by_id(world.done)},
        "GET /api/runs/{id}/compare/{other}/": {"path_parameters": pair},
        "GET /api/runs/{id}/compare/{other}": {"path_parameters": pair},
        "GET /api/approvals/": {},
        "GET /api/approvals/{id}/": {"path_parameters": {"id": str(world.approval.id)}},
        "POST /api/approvals/{id}/approve/": {
            "path_parameters": {"id": str(world.approval.id)},
            "body": {"request_hash": world.approval.request_hash},
        },
        "POST /api/approvals/{id}/reject/": {
            "path_parameters": {"id": str(rejectable.id)},
            "body": {"request_hash": rejectable.request_hash},
        },
        "POST /api/approvals/{id}/confirm/": {
            "path_parameters": {"id": str(confirmable.id)},
            "body": {"request_hash": confirmable.request_hash, "took_effect": True},
        },
        "GET /api/webhooks/": {},
        "POST /api/webhooks/": {"body": {"url": WEBHOOK_URL, "event_types": ["run.completed", "approval.requested"]}},
        "GET /api/webhooks/{id}/": {"path_parameters": {"id": str(world.subscription.id)}},
        "PATCH /api/webhooks/{id}/": {"path_parameters": {"id": str(world.subscription.id)}, "body": {"active": True}},
        "DELETE /api/webhooks/{id}/": {"path_parameters": {"id": str(doomed.id)}},
        "POST /api/webhooks/{id}/test/": {"path_parameters": {"id": str(world.subscription.id)}},
        "GET /api/webhooks/{id}/deliveries/": {"path_parameters": {"id": str(world.subscription.id)}},
    }


def failed_transiently(tenant) -> Run:
    """A run FAILED `dependency_unavailable` (its scripted model fails transiently on every attempt)."""
    from runs.services import agent_load

    flaky = {"provider": "scripted", "turns": [{"error": "transient"}]}
    agent_load(tenant=tenant, definition={"name": "flaky", "instructions": "x", "tools": [], "model": flaky})
    run = submit_driven(tenant, "flaky")
    assert run.failure["reason"] == "dependency_unavailable"
    return run


def uncertain_approval(tenant) -> Approval:
    """An `uncertain_side_effect` approval: a POST the server took and never answered."""
    from django.test import override_settings

    from runs.services import agent_load
    from tests.sink import Sink

    sink = Sink()
    sink.behaviours = ["close"]
    try:
        agent_load(
            tenant=tenant,
            definition={
                "name": "unsure",
                "instructions": "pay",
                "tools": ["http_post"],
                "model": {
                    "provider": "scripted",
                    "turns": [
                        {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {}}}]},
                        {"text": "paid"},
                    ],
                },
            },
        )
        with override_settings(AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=[sink.host]):
            approval = Approval.objects.get(run=submit_driven(tenant, "unsure"))
    finally:
        sink.close()
    assert approval.kind == "uncertain_side_effect"
    return approval


def exercise(strategy, examples, auth, checks, counts: Counter, failures: list, name: str) -> None:
    """Send `examples` cases drawn from `strategy`; count statuses, collect check failures."""

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def send(case):
        response = case.call(headers=auth)
        counts[response.status_code] += 1
        try:
            case.validate_response(response, checks=checks, headers=auth)
        except BaseException as exc:  # FailureGroup is a BaseExceptionGroup; collected, reported at the end
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            failures.append(f"{name} -> {response.status_code}: {str(exc)[:800]}")

    send()


def test_schemathesis_finds_no_server_error_and_every_operation_succeeds(world, operator, capsys, settings):
    # The seeds hold two live leases of one tenant and drive a third run in-process: no fair-share limit here
    # (AGENTRT_TENANT_MAX_RUNNING, README "Workers and tenants"), or the third run stays queued.
    settings.AGENTRT_TENANT_MAX_RUNNING = 0
    _, token = AuthToken.objects.create(user=operator)
    auth = {"Authorization": f"Token {token}"}
    app = WSGIHandler()
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", app, headers=auth)
    fixed = seeds(world, world.tenant)
    statuses: dict[str, Counter] = defaultdict(Counter)
    failures: list[str] = []

    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.label for op in operations} == set(fixed)

    for op in operations:
        plans = [
            ("positive", op.as_strategy(generation_mode=GenerationMode.POSITIVE)),
            ("negative", op.as_strategy(generation_mode=GenerationMode.NEGATIVE)),
            ("seeded", op.as_strategy(generation_mode=GenerationMode.POSITIVE, **fixed[op.label])),
        ]
        for mode, strategy in plans:
            checks = CHECKS + ([negative_data_rejection] if mode == "negative" else [])
            exercise(strategy, EXAMPLES[mode], auth, checks, statuses[op.label], failures, f"{mode} {op.label}")

    with capsys.disabled():
        print("\nschemathesis answers per operation (2xx / total, by status):")
        for label in sorted(statuses):
            counts = statuses[label]
            ok = sum(n for code, n in counts.items() if 200 <= code < 300)
            print(f"  {label:38s} 2xx={ok:3d} / {sum(counts.values()):3d}  {dict(sorted(counts.items()))}")
        for failure in failures[:40]:
            print(
                "FAILURE:", failure.splitlines()[0], "|", " ".join(line.strip() for line in failure.splitlines()[1:12])
            )
    server_errors = {label: c for label, c in statuses.items() if any(code >= 500 for code in c)}
    assert not server_errors, server_errors
    assert not failures, "\n".join(failures[:20])
    never_ok = [label for label in fixed if not any(200 <= code < 300 for code in statuses[label])]
    assert not never_ok, f"operations that never succeeded: {never_ok}"
