"""`manage.py runs ...` and `manage.py approvals ...` through real processes on
the test database: --json, the exit codes scripts rely on, tenant scoping as
the --as user (a superuser sees every tenant, acts in its own), a decision
bound to the card's request hash, refusals reported with their code, and
text a model wrote printed without its control characters."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.contrib.auth.models import Permission

from approvals.models import Approval
from runs.clock import CLOCK
from runs.models import Event, Run
from runs.runtime.executor import run_drive
from runs.services import agent_load, run_submit, tenant_create
from runs.services.run_list import short_id
from tests.conftest import ROOT, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)

HOOK = "http://127.0.0.1:9/hook"  # never called: the policy suspends before the call
ESCAPE = "\x1b[31mred\x1b[0m"


def cli(*args: str) -> SimpleNamespace:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    out = SimpleNamespace(code=done.returncode, out=done.stdout, err=done.stderr)
    out.json = json.loads(done.stdout) if args and "--json" in args and done.stdout.strip() else None
    return out


def agents(tenant, sink_url=None):
    defs = [
        {
            "name": "bot",
            "instructions": "x",
            "model": {"provider": "scripted", "turns": [{"text": ESCAPE}]},
            "tools": [],
        },
        {
            "name": "approver",
            "instructions": "pay",
            "tools": ["http_post"],
            "policy": {"default": "allow", "rules": [{"tool": "http_post", "decision": "require_approval"}]},
            "model": {
                "provider": "scripted",
                "turns": [
                    {"tool_calls": [{"name": "http_post", "arguments": {"url": HOOK, "json": {"amount": 500}}}]},
                    {"text": "paid"},
                ],
            },
        },
        {
            "name": "flaky",
            "instructions": "x",
            "tools": [],
            "model": {"provider": "scripted", "turns": [{"error": "transient"}]},
        },
        {
            "name": "refused",
            "instructions": "x",
            "tools": [],
            "model": {"provider": "scripted", "turns": [{"error": "permanent"}]},
        },
    ]
    if sink_url:
        defs.append(
            {
                "name": "unsure",
                "instructions": "pay",
                "tools": ["http_post"],
                "model": {
                    "provider": "scripted",
                    "turns": [
                        {"tool_calls": [{"name": "http_post", "arguments": {"url": sink_url, "json": {}}}]},
                        {"text": "paid"},
                    ],
                },
            }
        )
    for d in defs:
        agent_load(tenant=tenant, definition=d)


def submit(tenant, agent, text="hello", drive=True) -> Run:
    run, _ = run_submit(tenant=tenant, agent=agent, input=text)
    if drive:
        run_drive(run_id=run.id)
    return Run.objects.get(id=run.id)


@pytest.fixture
def world(db):
    acme, alice = tenant_create(name="acme", username="alice", password="pw")
    _, oncall = tenant_create(name="acme", username="oncall", password="pw", operator=True)
    oncall.user_permissions.add(Permission.objects.get(codename="resolve_approval"))
    globex, bob = tenant_create(name="globex", username="bob", password="pw")
    _, root = tenant_create(name="acme", username="root", password="pw", superuser=True)
    agents(acme)
    agents(globex)
    w = SimpleNamespace(acme=acme, globex=globex)
    w.done = submit(acme, "bot", text="say " + ESCAPE)
    w.queued = submit(acme, "bot", text="wait in line", drive=False)
    w.waiting = submit(acme, "approver", text="pay 500")
    w.approval = Approval.objects.get(run=w.waiting)
    w.theirs = submit(globex, "approver", text="pay 500")
    w.their_approval = Approval.objects.get(run=w.theirs)
    assert (w.done.status, w.queued.status, w.waiting.status) == ("COMPLETED", "QUEUED", "WAITING_FOR_APPROVAL")
    return w


def test_runs_list_is_the_users_tenant_as_json_filtered_and_paged(world):
    listed = cli("runs", "list", "--as", "alice", "--json")
    assert listed.code == 0, listed.err
    ids = {r["id"] for r in listed.json["results"]}
    assert ids == {str(world.done.id), str(world.queued.id), str(world.waiting.id)}
    row = next(r for r in listed.json["results"] if r["id"] == str(world.waiting.id))
    assert row["waiting_on"] == "approval" and row["cost"] == "0.0000" and row["short_id"] == short_id(world.waiting.id)
    assert {r["id"] for r in cli("runs", "list", "--as", "bob", "--json").json["results"]} == {str(world.theirs.id)}
    # Filters and search narrow within the tenant; nothing reaches another tenant's runs.
    assert [r["id"] for r in cli("runs", "list", "--as", "alice", "--status", "QUEUED", "--json").json["results"]] == [
        str(world.queued.id)
    ]
    assert cli("runs", "list", "--as", "bob", "--search", str(world.waiting.id), "--json").json["results"] == []
    assert cli("runs", "list", "--as", "bob", "--tenant", "acme", "--json").json["results"] == []
    # Paging: a cursor gives the next page, then none.
    first = cli("runs", "list", "--as", "alice", "--limit", "2", "--json").json
    assert len(first["results"]) == 2 and first["next_cursor"]
    second = cli("runs", "list", "--as", "alice", "--limit", "2", "--cursor", first["next_cursor"], "--json").json
    assert len(second["results"]) == 1 and second["next_cursor"] is None
    assert {r["id"] for r in first["results"] + second["results"]} == ids
    # A superuser sees every tenant, and narrows to one.
    every = cli("runs", "list", "--as", "root", "--json").json["results"]
    assert str(world.theirs.id) in {r["id"] for r in every} and {r["tenant"] for r in every} == {"acme", "globex"}
    assert {
        r["tenant"] for r in cli("runs", "list", "--as", "root", "--tenant", "globex", "--json").json["results"]
    } == {"globex"}
    text = cli("runs", "list", "--as", "alice")
    assert text.code == 0 and "WAITING_FOR_APPROVAL" in text.out and "approval" in text.out and "\x1b" not in text.out


def test_usage_errors_exit_2_naming_the_option(world):
    bad = cli("runs", "list", "--as", "alice", "--status", "DONE", "--json")
    assert bad.code == 2 and "--status" in bad.err
    assert bad.json["error"]["code"] == "invalid" and bad.json["error"]["exit"] == 2
    assert cli("runs", "list", "--as", "alice", "--since", "5y").code == 2
    assert cli("runs", "list", "--as", "alice", "--cursor", "garbage").code == 2
    assert cli("runs", "list").code == 2  # --as is required
    nobody = cli("runs", "list", "--as", "nobody")
    assert nobody.code == 2 and "unknown_user" in nobody.err
    tenant_create(name="acme", username="loner")  # then leave the tenant: a user of no tenant
    from runs.models import Membership

    Membership.objects.filter(user__username="loner").delete()
    assert cli("runs", "list", "--as", "loner").code == 5


def test_show_and_events_of_a_run_by_its_id_or_short_id(world):
    shown = cli("runs", "show", short_id(world.done.id), "--as", "alice", "--json")
    assert shown.code == 0, shown.err
    assert shown.json["id"] == str(world.done.id) and shown.json["final_message"] == ESCAPE
    text = cli("runs", "show", str(world.done.id), "--as", "alice")
    assert text.code == 0 and "\x1b" not in text.out and "\\x1b[31mred" in text.out  # shown, never sent
    assert "0.0000 USD" in text.out
    card = cli("runs", "show", str(world.waiting.id), "--as", "alice")
    assert (
        world.approval.request_hash in card.out and "http_post" in card.out and "decide     approve, reject" in card.out
    )
    events = cli("runs", "events", str(world.done.id), "--as", "alice", "--json")
    assert events.code == 0 and events.json["next_after"] is None
    assert [e["sequence"] for e in events.json["results"]] == sorted(
        Event.objects.filter(run=world.done).values_list("sequence", flat=True)
    )
    assert {"sequence", "type", "run", "payload", "occurred_at"} == set(events.json["results"][0])
    page = cli("runs", "events", str(world.done.id), "--as", "alice", "--after", "1", "--limit", "2", "--json").json
    assert [e["sequence"] for e in page["results"]] == [2, 3] and page["next_after"] == 3
    lines = cli("runs", "events", str(world.done.id), "--as", "alice").out.splitlines()
    assert lines[0].startswith("#1 ") and "run.created" in lines[0] and "+" in lines[1]
    # Another tenant's run is not found, for a member; a superuser may look.
    assert cli("runs", "show", str(world.theirs.id), "--as", "alice").code == 3
    assert cli("runs", "events", str(world.theirs.id), "--as", "alice").code == 3
    assert cli("runs", "show", str(world.theirs.id), "--as", "root").code == 0
    assert cli("runs", "show", "0123456789abcdef", "--as", "alice").code == 3


def test_cancel_exit_codes_and_who_is_recorded(world):
    ended = cli("runs", "cancel", str(world.done.id), "--as", "alice")
    assert ended.code == 4 and "run_terminal" in ended.err
    ended = cli("runs", "cancel", str(world.done.id), "--as", "alice", "--json")
    assert ended.code == 4 and ended.json["error"]["code"] == "run_terminal"
    # A superuser acts only in its own tenant: another tenant's run is not found.
    assert cli("runs", "cancel", str(world.theirs.id), "--as", "root").code == 3
    assert cli("runs", "cancel", str(world.theirs.id), "--as", "alice").code == 3
    assert Run.objects.get(id=world.theirs.id).status == "WAITING_FOR_APPROVAL"
    # A reason that is too long is a usage error naming --reason, and nothing is recorded.
    long = cli("runs", "cancel", str(world.queued.id), "--as", "alice", "--reason", "x" * 2001, "--json")
    assert long.code == 2 and "--reason" in long.err and long.json["error"]["fields"].keys() == {"reason"}
    assert not Event.objects.filter(run=world.queued, type="run.cancel_requested").exists()
    done = cli("runs", "cancel", str(world.queued.id), "--as", "alice", "--reason", "dup of #42 " + ESCAPE, "--json")
    assert done.code == 0, done.err
    assert done.json["id"] == str(world.queued.id) and done.json["status"] == "CANCELLED"
    requested = Event.objects.get(run=world.queued, type="run.cancel_requested")
    assert requested.payload == {"by": "alice", "via": "cli", "reason": "dup of #42 " + ESCAPE}
    cancelled = Event.objects.get(run=world.queued, type="run.cancelled")
    assert (cancelled.payload["by"], cancelled.payload["via"], cancelled.payload["reason"]) == (
        "alice",
        "cli",
        "dup of #42 " + ESCAPE,
    )
    shown = cli("runs", "show", str(world.queued.id), "--as", "alice", "--json").json
    assert (shown["cancel"]["by"], shown["cancel"]["via"]) == ("alice", "cli")
    assert shown["cancel"]["reason"] == "dup of #42 " + ESCAPE
    text = cli("runs", "show", str(world.queued.id), "--as", "alice").out
    assert "cancel     run.cancelled by alice via cli" in text and "dup of #42 \\x1b[31mred" in text
    assert "\x1b" not in text  # the reason is shown, its escape sequence never sent to the terminal


def test_retry_gives_a_transient_failure_a_new_attempt_and_refuses_the_rest(world):
    flaky = submit(world.acme, "flaky")
    refused = submit(world.acme, "refused")
    assert (flaky.failure["reason"], refused.failure["reason"]) == ("dependency_unavailable", "model_permanent_error")
    # Another tenant's run is not found; a run that did not fail, or failed for good, is a conflict naming why.
    assert cli("runs", "retry", str(flaky.id), "--as", "bob").code == 3
    theirs = submit(world.globex, "flaky")
    assert cli("runs", "retry", str(theirs.id), "--as", "root").code == 3  # a superuser acts in its own tenant only
    assert cli("runs", "retry", str(theirs.id), "--as", "alice").code == 3
    completed = cli("runs", "retry", str(world.done.id), "--as", "alice", "--json")
    assert completed.code == 4 and completed.json["error"]["code"] == "run_not_failed", completed.err
    permanent = cli("runs", "retry", short_id(refused.id), "--as", "alice")
    assert permanent.code == 4 and "run_not_retryable" in permanent.err and "model_permanent_error" in permanent.err
    assert not Event.objects.filter(run__in=[flaky, refused, theirs], type="run.retried").exists()

    retried = cli("runs", "retry", short_id(flaky.id), "--as", "alice", "--json")
    assert retried.code == 0, retried.err
    assert retried.json["id"] == str(flaky.id) and retried.json["status"] == "QUEUED"
    assert retried.json["failure"] is None
    (event,) = Event.objects.filter(run=flaky, type="run.retried")
    assert (event.payload["by"], event.payload["via"], event.payload["failure"]["reason"]) == (
        "alice",
        "cli",
        "dependency_unavailable",
    )
    # The same run, once more: it is QUEUED now, not failed.
    again = cli("runs", "retry", str(flaky.id), "--as", "alice")
    assert again.code == 4 and "run_not_failed" in again.err
    run_drive(run_id=flaky.id)  # the scripted model fails again: a second failure, retried in text mode
    assert Run.objects.get(id=flaky.id).status == "FAILED"
    text = cli("runs", "retry", str(flaky.id), "--as", "alice")
    assert text.code == 0 and "retried; it continues from its last checkpoint" in text.out, text.err
    assert [e.payload["by"] for e in Event.objects.filter(run=flaky, type="run.retried")] == ["alice", "alice"]


def test_a_decision_is_bound_to_the_cards_request_hash(world):
    listed = cli("approvals", "list", "--as", "oncall", "--json")
    assert listed.code == 0, listed.err
    (card,) = listed.json["results"]
    assert card["id"] == str(world.approval.id) and card["tool"] == "http_post"
    assert card["arguments"] == {"url": HOOK, "json": {"amount": 500}} and card["decisions"] == ["approve", "reject"]
    assert [c["id"] for c in cli("approvals", "list", "--as", "bob", "--json").json["results"]] == [
        str(world.their_approval.id)
    ]
    approval = str(world.approval.id)
    # No hash and no terminal to confirm at: nothing is decided.
    blind = cli("approvals", "approve", approval, "--as", "oncall")
    assert blind.code == 2 and "--request-hash" in blind.err and world.approval.request_hash in blind.out
    stale = cli("approvals", "approve", approval, "--as", "oncall", "--request-hash", "0" * 64, "--json")
    assert stale.code == 4 and stale.json["error"]["code"] == "approval_stale"
    # Permission, then scope: a member without the permission, another tenant's operator, a superuser elsewhere.
    assert cli("approvals", "approve", approval, "--as", "alice", "--request-hash", card["request_hash"]).code == 5
    assert cli("approvals", "approve", approval, "--as", "bob", "--request-hash", card["request_hash"]).code == 3
    assert Approval.objects.get(id=approval).status == "pending"
    done = cli(
        "approvals",
        "approve",
        approval,
        "--as",
        "oncall",
        "--request-hash",
        card["request_hash"],
        "--reason",
        "ok",
        "--json",
    )
    assert done.code == 0, done.err
    assert (
        done.json["status"] == "approved" and done.json["decided_by"] == "oncall" and done.json["decided_via"] == "cli"
    )
    row = Approval.objects.get(id=approval)
    assert (row.status, row.decided_via, row.reason) == ("approved", "cli", "ok")
    again = cli("approvals", "reject", approval, "--as", "oncall", "--request-hash", card["request_hash"])
    assert again.code == 4 and "approval_decided" in again.err
    assert cli("approvals", "list", "--as", "oncall", "--json").json["results"] == []
    decided = cli("approvals", "list", "--as", "oncall", "--status", "approved", "--json").json["results"]
    assert [c["decided_by"] for c in decided] == ["oncall"]
    shown = cli("runs", "show", str(world.waiting.id), "--as", "alice")
    assert "decided    approved by oncall via cli" in shown.out
    assert cli("approvals", "show", str(world.their_approval.id), "--as", "oncall").code == 3


def test_an_unknown_outcome_past_its_deadline_is_confirmed_not_approved(world, settings):
    from tests.sink import Sink

    sink = Sink()
    sink.behaviours = ["close"]
    try:
        agents(world.acme, sink_url=sink.url)
        settings.AGENTRT_HTTP_TOOL_ALLOWED_HOSTS = [sink.host]
        run = submit(world.acme, "unsure", text="pay once")
    finally:
        sink.close()
    approval = Approval.objects.get(run=run)
    assert approval.kind == "uncertain_side_effect"
    Run.objects.filter(id=run.id).update(deadline_at=CLOCK.now() - timedelta(seconds=1))  # the deadline passes
    card = cli("approvals", "show", str(approval.id), "--as", "oncall", "--json").json
    assert card["deadline_passed"] is True and card["decisions"] == ["reject", "confirm"]
    refused = cli("approvals", "approve", str(approval.id), "--as", "oncall", "--request-hash", approval.request_hash)
    assert refused.code == 4 and "run_deadline_passed" in refused.err
    confirmed = cli(
        "approvals",
        "confirm",
        str(approval.id),
        "--not-taken",
        "--as",
        "oncall",
        "--request-hash",
        approval.request_hash,
    )
    assert confirmed.code == 0, confirmed.err
    assert Approval.objects.get(id=approval.id).status == "confirmed"
    ended = Run.objects.get(id=run.id)
    assert ended.status == "FAILED" and ended.failure["reason"] == "deadline_exceeded"
    assert cli("approvals", "confirm", str(approval.id), "--as", "oncall").code == 2  # --took-effect or --not-taken


def _parsers(command: str):
    """The parser of `manage.py <command>` and of each of its subcommands."""
    import argparse

    from django.core.management import load_command_class

    app = {"runs": "runs", "approvals": "approvals", "submit_run": "runs"}[command]
    parser = load_command_class(app, command).create_parser("manage.py", command)
    yield command, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{command} {name}", sub


def test_every_option_has_help():
    """Each option and argument of the operator commands, and of submit_run, says what it is."""
    for command in ("runs", "approvals", "submit_run"):
        for name, parser in _parsers(command):
            for action in parser._actions:
                if action.dest in ("help", "version") or action.help == "==SUPPRESS==":
                    continue
                if parser.prog.endswith(command) and action.dest in (
                    "verbosity",
                    "settings",
                    "pythonpath",
                    "traceback",
                    "no_color",
                    "force_color",
                    "skip_checks",
                ):
                    continue  # Django's own
                assert action.help, f"{name}: {action.option_strings or action.dest} has no help"
            if name.startswith(("runs ", "approvals ")):
                assert "exit codes:" in parser.description, name
    shown = cli("runs", "list", "--help")
    assert shown.code == 0 and "--waiting-on {approval,user,child_runs}" in shown.out
