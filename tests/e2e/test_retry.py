"""Retry (issue 38 item 5) through a real qcluster, a model server that is
down and then up, and a real HTTP sink for the side effect.

- A run whose model server goes down after its side effect was sent and
  answered fails `dependency_unavailable`; `POST /api/runs/{id}/retry/`
  (or `manage.py runs retry`, a process of its own) gives it a new attempt
  of the same run: it continues from its last
  checkpoint (the model is asked the failed step again, with the recorded
  tool result), completes, and the POST was sent once.
- A run that failed while a side effect's outcome was unknown (the process
  raised between the send and the record: `internal_error`) is retried into
  an `interrupted_side_effect` approval: nothing is sent again until someone
  decides; confirmed, it completes with the one send.
- The retry policy is a setting: an outage of several tries within one
  attempt does not fail the run (it completes on its first attempt).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from approvals.models import Approval
from runs.models import Event, ModelCall, Run, ToolInvocation
from tests.conftest import ROOT, free_port, subprocess_env, wait_for
from tests.providers.conftest import KEY, PRICES
from tests.providers.fake_openai import FakeOpenAI, chunk, stream, text_stream, tool_delta, usage_chunk

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def api(tenant):
    client = APIClient()
    client.force_authenticate(get_user_model().objects.get(username="alice"))
    return client


@pytest.fixture
def model_port():
    """The model server's address: nothing listens there until a test starts a server on it."""
    servers: list[FakeOpenAI] = []
    port = free_port()

    def up(*plans) -> FakeOpenAI:
        server = FakeOpenAI(port=port).push(*plans).start()
        servers.append(server)
        return server

    up.port = port
    up.servers = servers
    yield up
    for server in servers:
        server.close()


def endpoints(port: int) -> dict:
    return {
        "test": {
            "provider": "openai",
            "base_url": f"http://127.0.0.1:{port}/v1",
            "api_key_env": "AGENTRT_TEST_OPENAI_KEY",
        }
    }


def model_env(port: int, **extra) -> dict:
    return dict(
        AGENTRT_MODEL_PRICES=json.dumps(PRICES),
        AGENTRT_MODEL_ENDPOINTS=json.dumps(endpoints(port)),
        AGENTRT_TEST_OPENAI_KEY=KEY,
        **extra,
    )


def gpt_agent(load_agent, settings, port: int, **extra):
    settings.AGENTRT_MODEL_ENDPOINTS = endpoints(port)
    settings.AGENTRT_MODEL_PRICES = PRICES
    return load_agent(name="gpt-bot", model={"provider": "openai", "endpoint": "test", "model": "test-model"}, **extra)


def post_call(url: str) -> dict:
    arguments = json.dumps({"url": url, "json": {"release": "1.4.2"}})
    return stream(
        [
            chunk("", role="assistant"),
            chunk(tool_calls=[tool_delta(0, id="c1", name="http_post", arguments=arguments)]),
            chunk(finish="tool_calls"),
            usage_chunk(30, 6),
        ]
    )


def status(run) -> str:
    return Run.objects.filter(id=run.id).values_list("status", flat=True).get()


def types(run) -> list[str]:
    return list(Event.objects.filter(run_id=run.id).order_by("sequence").values_list("type", flat=True))


def retry_by_cli(run) -> dict:
    """`manage.py runs retry` as a process of its own, as the run's tenant's user."""
    done = subprocess.run(
        [sys.executable, "manage.py", "runs", "retry", str(run.id), "--as", "alice", "--json"],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("via", ["api", "cli"])
def test_a_run_failed_by_a_model_outage_is_retried_from_its_checkpoint_and_sends_nothing_again(
    cluster, load_agent, submit, settings, sink, model_port, api, via
):
    gpt_agent(load_agent, settings, model_port.port, tools=("http_post",))
    sink.behaviours = ["delay:60"]  # the POST's answer is held while the model server goes down
    first = model_port(post_call(sink.url))
    c = cluster(
        **model_env(
            model_port.port,
            AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host,
            AGENTRT_MODEL_ATTEMPTS=2,  # a short policy: the outage outlasts it
            AGENTRT_MODEL_RETRY_TRIES=2,
            AGENTRT_MODEL_RETRY_BACKOFF_SECONDS=0.05,
        )
    )
    run = submit(agent="gpt-bot", text="ship it")
    wait_for(lambda: sink.count() == 1, timeout=60, message=f"the POST\n{c.output()[-3000:]}")
    first.close()  # the model server is down
    sink.release.set()
    wait_for(lambda: status(run) == "FAILED", timeout=60, message=f"the failure\n{c.output()[-3000:]}")
    failed = Run.objects.get(id=run.id)
    assert failed.failure["reason"] == "dependency_unavailable"
    body = api.get(f"/api/runs/{run.id}/").json()
    assert body["retryable"] is True

    second = model_port(text_stream("Shipped ", "1.4.2."))  # the model server is back
    if via == "api":
        answer = api.post(f"/api/runs/{run.id}/retry/", {}, format="json")
        assert answer.status_code == 202, answer.content
        body = answer.json()
    else:
        body = retry_by_cli(run)
    assert body["status"] == "QUEUED" and body["failure"] is None
    wait_for(lambda: status(run) == "COMPLETED", timeout=60, message=f"the retried run\n{c.output()[-3000:]}")

    done = Run.objects.get(id=run.id)
    assert done.final_message == "Shipped 1.4.2."
    assert sink.count() == 1  # the recorded effect was answered from the record, never sent again
    (invocation,) = ToolInvocation.objects.filter(run_id=run.id)
    assert invocation.status == "completed" and invocation.attempt == 1
    # The model was asked the failed step again, once, with the recorded tool result in its context.
    (request,) = second.requests
    tool_messages = [m for m in request["body"]["messages"] if m.get("role") == "tool"]
    assert len(tool_messages) == 1 and "200" in tool_messages[0]["content"]
    order = types(run)
    assert order.index("run.failed") < order.index("run.retried") < order.index("run.completed")
    retried = Event.objects.get(run_id=run.id, type="run.retried").payload
    assert (retried["by"], retried["via"], retried["failure"]["reason"]) == ("alice", via, "dependency_unavailable")
    # Step 2's attempts continue the numbering: the failed ones stay in the record.
    attempts = list(
        ModelCall.objects.filter(run_id=run.id, step_number=2)
        .order_by("attempt_number")
        .values_list("status", flat=True)
    )
    assert attempts[-1] == "completed" and set(attempts[:-1]) == {"failed"}

    again = api.post(f"/api/runs/{run.id}/retry/", {}, format="json")
    assert again.status_code == 409 and again.json()["code"] == "run_not_failed"


def test_a_retry_of_a_run_whose_side_effect_outcome_is_unknown_asks_before_anything_is_sent(
    cluster, load_agent, submit, sink, api, tmp_path, operator
):
    post = {"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": 5}}}
    load_agent(turns=[{"tool_calls": [post]}, {"text": "paid"}], tools=("http_post",))
    c = cluster(
        AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host,
        AGENTRT_ENABLE_FAULTPOINTS=1,
        AGENTRT_FAULTPOINTS="tool.after_execute=raise",  # sent and answered, then the worker fails before the record
        AGENTRT_FAULTPOINT_DIR=tmp_path,
    )
    run = submit()
    wait_for(lambda: status(run) == "FAILED", timeout=60, message=f"the failure\n{c.output()[-3000:]}")
    assert Run.objects.get(id=run.id).failure["reason"] == "internal_error" and sink.count() == 1

    answer = api.post(f"/api/runs/{run.id}/retry/", format="json")
    assert answer.status_code == 202, answer.content
    assert answer.json()["status"] == "WAITING_FOR_APPROVAL"
    approval = Approval.objects.get(run_id=run.id, status="pending")
    assert approval.kind == "interrupted_side_effect"
    assert sink.count() == 1  # nothing is sent again before someone decides

    operator_api = APIClient()
    operator_api.force_authenticate(operator)
    decided = operator_api.post(
        f"/api/approvals/{approval.id}/confirm/",
        {"request_hash": approval.request_hash, "took_effect": True, "reason": "the sink has it"},
        format="json",
    )
    assert decided.status_code == 200, decided.content
    wait_for(lambda: status(run) == "COMPLETED", timeout=60, message=f"the run\n{c.output()[-3000:]}")
    assert Run.objects.get(id=run.id).final_message == "paid"
    assert sink.count() == 1


def test_a_several_second_outage_within_the_retry_policy_does_not_fail_the_run(
    cluster, load_agent, submit, settings, model_port
):
    gpt_agent(load_agent, settings, model_port.port, tools=("echo",))
    c = cluster(
        **model_env(
            model_port.port,
            AGENTRT_MODEL_RETRY_TRIES=12,
            AGENTRT_MODEL_RETRY_BACKOFF_SECONDS=0.5,
            AGENTRT_MODEL_RETRY_BACKOFF_MAX_SECONDS=1,
            AGENTRT_LOG_LEVEL="INFO",
        )
    )
    run = submit(agent="gpt-bot", text="hello")
    # The server is down for at least four tries of the one attempt (more than the old policy's three tries)...
    wait_for(
        lambda: "model attempt try 4 failed before output" in c.output(),
        timeout=60,
        message=f"four failed tries\n{c.output()[-3000:]}",
    )
    server = model_port(text_stream("hello ", "back"))  # ... and then it is up
    wait_for(lambda: status(run) in ("COMPLETED", "FAILED"), timeout=60, message=f"the run\n{c.output()[-3000:]}")
    done = Run.objects.get(id=run.id)
    assert done.status == "COMPLETED", done.failure
    assert done.final_message == "hello back" and len(server.requests) == 1
    # One attempt of one step: the outage never reached the loop (no failed attempt, no model.response.failed).
    assert list(ModelCall.objects.filter(run_id=run.id).values_list("step_number", "attempt_number", "status")) == [
        (1, 1, "completed")
    ]
    assert "model.response.failed" not in types(run)
