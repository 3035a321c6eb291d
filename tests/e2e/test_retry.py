"""The model-call retry policy is a setting (issue 38 item 5), through a real
qcluster and a model server that is down and then up: an outage of several
tries within one attempt does not fail the run (it completes on its first
attempt)."""

from __future__ import annotations

import json

import pytest

from runs.models import Event, ModelCall, Run
from tests.conftest import free_port, wait_for
from tests.providers.conftest import KEY, PRICES
from tests.providers.fake_openai import FakeOpenAI, text_stream

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


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


def status(run) -> str:
    return Run.objects.filter(id=run.id).values_list("status", flat=True).get()


def types(run) -> list[str]:
    return list(Event.objects.filter(run_id=run.id).order_by("sequence").values_list("type", flat=True))


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
