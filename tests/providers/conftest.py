from __future__ import annotations

import random
from uuid import uuid4

import pytest

from runs.domain.cancellation import Token
from runs.domain.values import ModelRequest
from runs.providers.endpoints import Endpoint
from runs.providers.openai import OpenAIProvider
from tests.providers.fake_openai import FakeOpenAI

KEY = "sk-test-SECRET-5f2c9a71d0"
PRICES = {
    "test-model": {"input_per_mtok": 2.0, "output_per_mtok": 8.0, "cache_read_per_mtok": 0.5},
}


class RecordingToken(Token):
    """A real token whose backoff waits are recorded (and skipped unless `real`)."""

    def __init__(self, real: bool = False):
        super().__init__()
        self.waits: list[float] = []
        self.real = real

    def wait(self, timeout=None):
        self.waits.append(timeout)
        return super().wait(timeout if self.real else 0)


@pytest.fixture
def fake():
    server = FakeOpenAI().start()
    yield server
    server.close()


@pytest.fixture
def priced(settings):
    settings.AGENTRT_MODEL_PRICES = PRICES
    return settings


def endpoints_for(fake, name: str = "test", env: str = "AGENTRT_TEST_OPENAI_KEY", **extra) -> dict:
    """An `AGENTRT_MODEL_ENDPOINTS` value with one endpoint at the fake server."""
    return {name: {"provider": "openai", "base_url": fake.base_url, "api_key_env": env, **extra}}


@pytest.fixture
def api_key(monkeypatch):
    monkeypatch.setenv("AGENTRT_TEST_OPENAI_KEY", KEY)
    return KEY


@pytest.fixture
def make_provider(fake, priced, api_key):
    def make(**kwargs) -> OpenAIProvider:
        endpoint = Endpoint(
            name="test",
            provider="openai",
            base_url=kwargs.pop("base_url", fake.base_url),
            api_key_env="AGENTRT_TEST_OPENAI_KEY",
        )
        kwargs.setdefault("rng", random.Random(7))
        kwargs.setdefault("backoff_base", 0.01)
        return OpenAIProvider(endpoint, kwargs.pop("model", "test-model"), **kwargs)

    return make


def make_request(messages=None, *, tools=None, tool_choice="auto", instructions="Be brief.", step=1) -> ModelRequest:
    return ModelRequest(
        run_id=uuid4(),
        step_number=step,
        attempt_number=1,
        instructions=instructions,
        messages=messages if messages is not None else [{"role": "user", "content": "hello"}],
        tools=tools or [],
        tool_choice=tool_choice,
    )
