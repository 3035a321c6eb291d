"""Discovery of a project's tools and providers (issue 13, items 1 and 4).

Every kind of process — a management command, the worker (`qcluster`), the
maintenance loop and the web server (daphne) — imports the modules named in
AGENTRT_TOOL_MODULES / AGENTRT_PROVIDER_MODULES and each installed app's
`agent_tools` / `agent_providers`; one that fails stops the process naming the
module and the error, and so do two tools with one name.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from runs import extensions
from runs.providers import PROVIDERS, provider_for
from runs.tools import REGISTRY
from tests.conftest import ROOT, free_port, subprocess_env

COMMANDS = {
    "management command": [sys.executable, "manage.py", "check"],
    "worker": [sys.executable, "manage.py", "qcluster"],
    "maintenance": [sys.executable, "manage.py", "run_maintenance"],
    "web": [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", "{port}", "agentrt_site.asgi:application"],
}


def start(kind: str, **env) -> subprocess.CompletedProcess:
    argv = [a.replace("{port}", str(free_port())) for a in COMMANDS[kind]]
    return subprocess.run(argv, cwd=ROOT, env=subprocess_env(**env), capture_output=True, text=True, timeout=120)


@pytest.mark.django_db
@pytest.mark.parametrize("kind", list(COMMANDS))
def test_every_process_refuses_to_start_when_a_tool_module_fails_to_import(kind):
    done = start(kind, AGENTRT_TOOL_MODULES="tests.tool_modules.refunds, tests.tool_modules.broken")
    assert done.returncode != 0
    assert "AGENTRT_TOOL_MODULES: could not import 'tests.tool_modules.broken'" in done.stderr, done.stderr[-2000:]
    assert "RuntimeError: the refunds backend is not configured" in done.stderr


@pytest.mark.django_db
@pytest.mark.parametrize(
    "env, named",
    [
        (
            {"AGENTRT_TOOL_MODULES": "tests.tool_modules.duplicate"},
            "two tools are named 'echo': runs.tools.builtin.echo and tests.tool_modules.duplicate.another_echo",
        ),
        ({"AGENTRT_TOOL_MODULES": "tests.tool_modules.nowhere"}, "No module named 'tests.tool_modules.nowhere'"),
        ({"AGENTRT_TOOL_MODULES": "tests/tool_modules/refunds.py"}, "is not a dotted module path"),
        (
            {"AGENTRT_PROVIDER_MODULES": "tests.tool_modules.broken"},
            "AGENTRT_PROVIDER_MODULES: could not import 'tests.tool_modules.broken'",
        ),
        (
            {"AGENTRT_PROVIDER_MODULES": "tests.tool_modules.duplicate_provider"},
            "two providers are named 'openai': runs.providers.openai.build and "
            "tests.tool_modules.duplicate_provider.build",
        ),
        (
            {
                "AGENTRT_MODEL_ENDPOINTS": json.dumps(
                    {"local": {"provider": "nope", "base_url": "http://h/v1", "api_key_env": "K"}}
                )
            },
            "AGENTRT_MODEL_ENDPOINTS['local'].provider: must be one of anthropic, openai",
        ),
    ],
)
def test_a_bad_extension_stops_a_process_naming_what_is_wrong(env, named):
    done = start("management command", **env)
    assert done.returncode != 0
    assert named in done.stderr, done.stderr[-2000:]


@pytest.mark.django_db
def test_configured_modules_and_app_modules_are_loaded_by_a_process():
    code = (
        "from runs.tools import REGISTRY; from runs.providers import PROVIDERS; "
        "print(sorted(REGISTRY.names())); print(REGISTRY.spec('issue_refund').parameters['required']); "
        "print(sorted(PROVIDERS.names()))"
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=subprocess_env(
            AGENTRT_TOOL_MODULES="tests.tool_modules.refunds",
            AGENTRT_PROVIDER_MODULES="tests.tool_modules.echo_provider",
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    names, required, providers = done.stdout.strip().splitlines()[-3:]
    assert "'issue_refund'" in names  # named in AGENTRT_TOOL_MODULES
    assert "'charge_card'" in names  # examples.payments is installed: its agent_tools module was found
    assert required == "['order_id', 'amount_cents']"
    assert providers == "['anthropic', 'echo_model', 'openai', 'scripted']"


def test_a_failed_load_leaves_nothing_half_registered(settings):
    settings.AGENTRT_TOOL_MODULES = "tests.tool_modules.broken"
    before = REGISTRY.names()
    with pytest.raises(ImproperlyConfigured, match="could not import 'tests.tool_modules.broken'"):
        extensions.load()
    assert REGISTRY.spec("half_registered") is None  # it registered, then its module failed: rolled back
    assert REGISTRY.names() == before


@pytest.fixture
def echo_provider(settings):
    snapshot = PROVIDERS.snapshot()
    settings.AGENTRT_PROVIDER_MODULES = ["tests.tool_modules.echo_provider"]
    extensions.load()
    yield PROVIDERS.get("echo_model")
    PROVIDERS.restore(snapshot)
    sys.modules.pop("tests.tool_modules.echo_provider", None)


def test_a_project_provider_is_a_member_of_the_agent_schema_and_provider_for_builds_it(echo_provider):
    from pydantic import ValidationError

    from runs.api.serializers import pydantic_fields
    from runs.services.agent_schema import AgentDefinition

    parsed = AgentDefinition.model_validate(
        {"name": "e", "model": {"provider": "echo_model", "shout": True}}, strict=True
    )
    assert type(parsed.model).__name__ == "EchoModel" and parsed.model.shout is True
    with pytest.raises(ValidationError) as info:
        AgentDefinition.model_validate({"name": "e", "model": {"provider": "echo_model", "shout": "loud"}}, strict=True)
    assert pydantic_fields(info.value) == {"model.shout": ["Input should be a valid boolean"]}  # no union tag
    assert type(provider_for({"provider": "echo_model"})).__name__ == "EchoProvider"
    assert echo_provider.streams is False


def test_the_agent_schema_forgets_a_provider_that_is_gone(echo_provider):
    from pydantic import ValidationError

    from runs.services.agent_schema import AgentDefinition

    PROVIDERS.unregister("echo_model")
    with pytest.raises(ValidationError) as info:
        AgentDefinition.model_validate({"name": "e", "model": {"provider": "echo_model"}}, strict=True)
    assert "echo_model" in str(info.value) and "does not match any of the expected tags" in str(info.value)


@pytest.mark.django_db
def test_an_installed_apps_agent_providers_module_is_found_by_autodiscovery():
    code = "from runs.providers import PROVIDERS; print(sorted(PROVIDERS.names())); print(PROVIDERS.get('tape').origin)"
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=subprocess_env(AGENTRT_EXTRA_APPS="examples.payments,tests.provider_app", AGENTRT_PROVIDER_MODULES=""),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    names, origin = done.stdout.strip().splitlines()[-2:]
    assert names == "['anthropic', 'openai', 'scripted', 'tape']"  # named nowhere but found in the installed app
    assert origin == "tests.provider_app.agent_providers.build"


@pytest.fixture
def tape(settings):
    """The `tape` provider of tests/provider_app, loaded as a configured module."""
    snapshot = PROVIDERS.snapshot()
    settings.AGENTRT_PROVIDER_MODULES = ["tests.provider_app.agent_providers"]
    extensions.load()
    module = sys.modules["tests.provider_app.agent_providers"]
    module.PRICE_CHECKS.clear()
    module.BUILT_WITH.clear()
    yield module
    PROVIDERS.restore(snapshot)
    sys.modules.pop("tests.provider_app.agent_providers", None)


@pytest.mark.django_db(transaction=True)
def test_agent_validation_calls_a_project_providers_own_price_check(tape, load_agent):
    from runs.errors import InvalidInput

    with pytest.raises(InvalidInput) as refused:
        load_agent(model={"provider": "tape", "model": "tape-huge"})
    assert list(refused.value.fields) == ["model"]
    assert "model 'tape-huge' is not on the tape price list (tape-small)" in refused.value.fields["model"][0]
    assert load_agent(model={"provider": "tape", "model": "tape-small"}).definition["model"]["model"] == "tape-small"
    assert tape.PRICE_CHECKS == ["tape-huge", "tape-small"]


@pytest.mark.django_db(transaction=True)
def test_a_project_provider_that_streams_gets_the_delta_batcher(tape, load_agent, submit):
    from runs.models import Event, Run
    from runs.runtime.executor import run_drive
    from runs.runtime.wiring import DeltaBatcher

    text = "play it again " * 160  # 2,240 characters in two pieces: each fills the batcher's 1 KiB buffer
    load_agent(model={"provider": "tape", "model": "tape-small", "text": text, "pieces": 2})
    run = submit()
    assert run_drive(run_id=run.id).kind.value == "completed"
    assert Run.objects.get(id=run.id).final_message == text
    assert [type(d) for d in tape.BUILT_WITH][-1] is DeltaBatcher  # the executor built it with the batcher
    deltas = Event.objects.filter(run=run, type="model.response.delta").order_by("sequence")
    assert "".join(e.payload["text"] for e in deltas) == text  # what it streamed became delta events
    assert [e.payload["index"] for e in deltas] == [1, 2]


def test_the_built_in_endpoints_come_from_the_providers_registry_entries(settings):
    from runs.providers.endpoints import configured, known_providers

    settings.AGENTRT_MODEL_ENDPOINTS = {}
    endpoints = configured()
    assert (endpoints["openai"].provider, endpoints["openai"].base_url, endpoints["openai"].api_key_env) == (
        "openai",
        "https://api.openai.com/v1",
        "OPENAI_API_KEY",
    )
    assert (endpoints["anthropic"].provider, endpoints["anthropic"].base_url, endpoints["anthropic"].api_key_env) == (
        "anthropic",
        "https://api.anthropic.com/v1",
        "ANTHROPIC_API_KEY",
    )
    assert set(endpoints) == {"openai", "anthropic"}
    assert known_providers() == {"openai", "anthropic"}  # scripted takes no endpoint


@pytest.fixture
def restored_providers():
    snapshot = PROVIDERS.snapshot()
    yield
    PROVIDERS.restore(snapshot)


def test_a_new_endpoint_provider_is_one_registry_entry(settings, restored_providers):
    """Its built-in endpoint, its name in endpoint entries and provider_for all follow from the entry."""
    from typing import Literal

    from runs.providers import register_provider
    from runs.providers.config import EndpointModel
    from runs.providers.endpoints import configured, known_providers, parse_endpoints

    class AcmeModel(EndpointModel):
        provider: Literal["acme"]
        endpoint: str = "acme"

    built = []

    @register_provider(
        "acme", config=AcmeModel, endpoint=True, base_url="https://api.acme.test/v1", api_key_env="ACME_API_KEY"
    )
    def build(endpoint, block, on_delta=None):
        built.append((endpoint.name, endpoint.base_url, endpoint.api_key_env, block["model"]))
        return object()

    settings.AGENTRT_MODEL_ENDPOINTS = {}
    assert "acme" in known_providers() and configured()["acme"].base_url == "https://api.acme.test/v1"
    assert parse_endpoints({"mine": {"provider": "acme", "base_url": "http://127.0.0.1:9/v1", "api_key_env": "K"}})
    provider_for({"provider": "acme", "model": "roadrunner"})
    assert built == [("acme", "https://api.acme.test/v1", "ACME_API_KEY", "roadrunner")]

    PROVIDERS.unregister("acme")
    assert "acme" not in configured() and "acme" not in known_providers()


@pytest.mark.parametrize(
    "declared, named",
    [
        (
            {"base_url": "ftp://acme.test", "api_key_env": "K"},
            "its built-in endpoint's base_url: must be an http(s) URL",
        ),
        ({"base_url": "https://acme.test/v1"}, "needs both base_url and api_key_env"),
        ({"base_url": "https://acme.test/v1", "api_key_env": "K", "endpoint": False}, "needs endpoint=True"),
    ],
)
def test_a_bad_built_in_endpoint_is_refused_when_the_provider_registers(restored_providers, declared, named):
    from typing import Literal

    from runs.providers import register_provider
    from runs.providers.config import EndpointModel

    class AcmeModel(EndpointModel):
        provider: Literal["acme"]

    with pytest.raises(TypeError, match=re.escape(named)):
        register_provider("acme", config=AcmeModel, **{"endpoint": True, **declared})(lambda *a: None)
    assert PROVIDERS.get("acme") is None
