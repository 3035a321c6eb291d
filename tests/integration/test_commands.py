"""Management commands of DESIGN §16 and their refusals of bad input."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from runs.models import Agent, AgentVersion, Run

pytestmark = pytest.mark.django_db(transaction=True)

GOOD = {
    "name": "release-bot",
    "instructions": "x",
    "model": {"provider": "scripted", "turns": [{"text": "hi"}]},
    "tools": ["echo", "http_post"],
    "policy": {
        "default": "allow",
        "rules": [
            {
                "tool": "http_post",
                "decision": "require_approval",
                "when": {"arg": "json.amount", "op": "gt", "value": 100},
            }
        ],
    },
    "limits": {"max_steps": 32, "max_tool_calls": 64, "deadline_seconds": 3600},
}


def write(tmp_path, data, name="agent.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_create_tenant_load_agent_submit_and_show(tmp_path, capsys):
    call_command("create_tenant", "demo", "--user", "ops")
    call_command("load_agent", write(tmp_path, GOOD))
    version = capsys.readouterr().out.strip().splitlines()[-1]
    assert AgentVersion.objects.get(agent__name="release-bot").version == version
    call_command("load_agent", write(tmp_path, GOOD))  # same content, same version
    assert capsys.readouterr().out.strip().splitlines()[-1] == version
    assert AgentVersion.objects.count() == 1
    call_command("submit_run", "--agent", "release-bot", "--input", "ship it")
    run_id = capsys.readouterr().out.strip()
    call_command("show_run", run_id, "--events")
    shown = json.loads(capsys.readouterr().out)
    assert shown["id"] == run_id and shown["status"] == "QUEUED" and shown["agent"] == "release-bot"
    assert [e["type"] for e in shown["events"]] == ["run.created"]
    assert set(shown["usage"]) == {
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
        "reasoning_tokens",
        "cost_usd",
        "model_calls",
        "tool_calls",
        "steps",
    }


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d.update(colour="red"), "colour"),
        (lambda d: d["model"].update(temperature=1), "temperature"),
        (lambda d: d.update(tools=["echo", "teleport"]), "tools"),
        (lambda d: d["policy"]["rules"][0]["when"].update(op="approx"), "op"),
        (lambda d: d["limits"].update(max_steps=-1), "max_steps"),
        (lambda d: d["limits"].update(max_stepz=3), "max_stepz"),
        (lambda d: d.update(name=""), "name"),
        (lambda d: d["policy"].update(default="maybe"), "default"),
    ],
)
def test_load_agent_refuses_an_invalid_definition_naming_the_field(tmp_path, mutate, field):
    call_command("create_tenant", "demo", "--user", "ops")
    data = json.loads(json.dumps(GOOD))
    mutate(data)
    with pytest.raises(CommandError) as exc:
        call_command("load_agent", write(tmp_path, data))
    assert field in str(exc.value)
    assert Agent.objects.count() == 0 and AgentVersion.objects.count() == 0


def test_submit_run_refuses_an_unknown_agent_and_a_second_active_run(tmp_path, capsys):
    from runs.errors import ActiveRunExists
    from runs.services import run_submit, tenant_get

    call_command("create_tenant", "demo", "--user", "ops")
    with pytest.raises(CommandError, match="no agent named 'ghost'"):
        call_command("submit_run", "--agent", "ghost", "--input", "x")
    call_command("load_agent", write(tmp_path, GOOD))
    tenant = tenant_get(name="demo")
    first, _ = run_submit(tenant=tenant, agent="release-bot", input="one")
    with pytest.raises(ActiveRunExists):
        run_submit(tenant=tenant, agent="release-bot", input="two", session=first.session_id)
    assert Run.objects.count() == 1


def test_idempotency_key_replays_and_conflicts(tmp_path):
    from runs.errors import IdempotencyConflict
    from runs.services import run_submit, tenant_get

    call_command("create_tenant", "demo", "--user", "ops")
    call_command("load_agent", write(tmp_path, GOOD))
    tenant = tenant_get(name="demo")
    a, created = run_submit(tenant=tenant, agent="release-bot", input="one", idempotency_key="k1")
    b, again = run_submit(tenant=tenant, agent="release-bot", input="one", idempotency_key="k1")
    assert created and not again and a.id == b.id
    with pytest.raises(IdempotencyConflict):
        run_submit(tenant=tenant, agent="release-bot", input="other", idempotency_key="k1")
    assert Run.objects.count() == 1


@pytest.mark.parametrize("text", ["a\x00b", "\ud800", ""])
def test_run_input_with_nul_surrogate_or_nothing_is_refused(tmp_path, text):
    from runs.errors import InvalidInput
    from runs.services import run_submit, tenant_get

    call_command("create_tenant", "demo", "--user", "ops")
    call_command("load_agent", write(tmp_path, GOOD))
    with pytest.raises(InvalidInput) as exc:
        run_submit(tenant=tenant_get(name="demo"), agent="release-bot", input=text)
    assert "input" in exc.value.fields
    assert Run.objects.count() == 0


def test_limits_may_only_tighten_the_agents(tmp_path):
    from runs.errors import InvalidInput
    from runs.services import run_submit, tenant_get

    call_command("create_tenant", "demo", "--user", "ops")
    call_command("load_agent", write(tmp_path, GOOD))
    tenant = tenant_get(name="demo")
    with pytest.raises(InvalidInput) as exc:
        run_submit(tenant=tenant, agent="release-bot", input="x", limits={"max_steps": 100})
    assert "limits.max_steps" in exc.value.fields
    run, _ = run_submit(tenant=tenant, agent="release-bot", input="x", limits={"max_steps": 4})
    assert run.limits["max_steps"] == 4
