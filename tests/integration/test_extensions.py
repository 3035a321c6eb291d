"""Discovery of a project's tools and providers (issue 13, items 1 and 4).

Every kind of process — a management command, the worker (`qcluster`), the
maintenance loop and the web server (daphne) — imports the modules named in
AGENTRT_TOOL_MODULES / AGENTRT_PROVIDER_MODULES and each installed app's
`agent_tools` / `agent_providers`; one that fails stops the process naming the
module and the error, and so do two tools with one name.
"""

from __future__ import annotations

import json
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
