"""README's "Add your own tool" and "Write a reconciler" are real paths to a
run (issue 13, item 6): their blocks are read from README.md and run as
written — the tool module is written into a package of its own named in
AGENTRT_TOOL_MODULES, the agent JSON and the shipped
examples/payments/cashier.json are loaded by the `load_agent` command the
README names, runs are submitted by `submit_run` and driven by the real
runtime (in-process `run_drive`, on the real PostgreSQL schema). No block
uses a name it does not define or import; the README's reconciler is the
example app's own."""

from __future__ import annotations

import ast
import builtins
import json
import re
import shlex
import symtable
import sys
import textwrap
from io import StringIO
from uuid import uuid4

import pytest
from django.core.management import call_command, get_commands, load_command_class

from runs import extensions
from runs.models import Run, ToolInvocation
from runs.runtime.executor import run_drive
from runs.tools import REGISTRY
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db(transaction=True)

README = (ROOT / "docs" / "extending.md").read_text()  # the extending page of the documentation


def block(marker: str) -> str:
    """The indented code block after `<!-- marker -->`, dedented."""
    found = re.search(rf"<!-- {re.escape(marker)} -->\n\n((?:    .*\n|\n)+)", README)
    assert found, f"docs/extending.md has no {marker} block"
    return textwrap.dedent(found.group(1)).strip("\n") + "\n"


def free_names(source: str) -> set[str]:
    """Names a module reads from its globals (module level, classes, functions)."""

    def walk(table: symtable.SymbolTable) -> set[str]:
        names = {
            s.get_name()
            for s in table.get_symbols()
            if s.is_referenced() and (s.is_global() or (table.get_type() == "module" and not s.is_imported()))
        }
        for child in table.get_children():
            names |= walk(child)
        return names

    return walk(symtable.symtable(source, "README.md", "exec"))


def undefined(source: str) -> set[str]:
    namespace: dict = {"__name__": "readme_snippet"}
    snapshot = REGISTRY.snapshot()
    try:
        exec(compile(source, "README.md", "exec"), namespace)  # noqa: S102 - our own README's code
    finally:
        REGISTRY.restore(snapshot)  # what it registered is not left behind
    return {name for name in free_names(source) if name not in namespace and not hasattr(builtins, name)}


def commands(marker: str) -> dict[str, list[str]]:
    """`manage.py` command name -> its arguments, for each command line of a block;
    each is a real command whose parser takes the arguments as written."""
    found = {}
    for line in block(marker).splitlines():
        argv = shlex.split(line, comments=True)
        if "manage.py" not in argv:
            continue
        at = argv.index("manage.py")
        name, args = argv[at + 1], argv[at + 2 :]
        assert name in get_commands(), f"README names manage.py {name}, which does not exist"
        load_command_class(get_commands()[name], name).create_parser("manage.py", name).parse_args(args)
        found[name] = args
    return found


def as_run_here(args: list[str], tenant) -> list[str]:
    """The README's arguments against the test tenant, without waiting for a worker."""
    args = [a for a in args if a != "--wait"]
    return [tenant.name if i and args[i - 1] == "--tenant" else a for i, a in enumerate(args)]


def submitted(args: list[str], tenant) -> Run:
    out = StringIO()
    call_command("submit_run", *as_run_here(args, tenant), stdout=out)
    return Run.objects.get(id=out.getvalue().split()[0])


@pytest.fixture
def readme_tool(tmp_path, monkeypatch, settings):
    """The README's tool module as a package of its own, named in AGENTRT_TOOL_MODULES."""
    package = f"readme_refunds_{uuid4().hex[:8]}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "agent_tools.py").write_text(block("readme-tool"))
    monkeypatch.syspath_prepend(str(tmp_path))
    settings.AGENTRT_TOOL_MODULES = f"{package}.agent_tools"
    snapshot = REGISTRY.snapshot()
    extensions.load()
    yield sys.modules[f"{package}.agent_tools"]
    REGISTRY.restore(snapshot)
    sys.modules.pop(f"{package}.agent_tools", None)
    sys.modules.pop(package, None)


def test_the_readme_tool_snippets_use_no_undefined_names():
    assert undefined(block("readme-tool")) == set()
    assert undefined(block("readme-reconciler")) == set()


def test_the_readme_tool_runs_through_the_runtime_as_written(readme_tool, tenant, tmp_path):
    steps = commands("readme-tool-commands")
    assert set(steps) == {"load_agent", "submit_run", "show_run"}
    agent_file = tmp_path / "refunder.json"
    agent_file.write_text(block("readme-tool-agent"))
    call_command("load_agent", str(agent_file), *as_run_here(steps["load_agent"][1:], tenant), stdout=StringIO())

    run = submitted(steps["submit_run"], tenant)
    assert run_drive(run_id=run.id).kind.value == "completed"
    run.refresh_from_db()
    assert run.status == "COMPLETED" and run.final_message == "Refunded 25.00 on ord_1001."
    call = ToolInvocation.objects.get(run=run)
    assert (call.tool_name, call.status) == ("issue_refund", "completed")
    assert call.result == {"refund_id": "re_1", "order_id": "ord_1001", "amount_cents": 2500}
    assert list(readme_tool.ISSUED) == [call.idempotency_key]  # the function ran once, with the call's key

    out = StringIO()
    call_command("show_run", str(run.id), "--events", stdout=out)
    assert "issue_refund" in out.getvalue()


def test_the_readme_agents_policy_holds_a_large_refund_for_a_person(readme_tool, tenant):
    from runs.services import agent_load, run_submit

    definition = json.loads(block("readme-tool-agent"))
    definition["model"]["turns"][0]["tool_calls"][0]["arguments"]["amount_cents"] = 20_000
    agent_load(tenant=tenant, definition=definition)
    run, _ = run_submit(tenant=tenant, agent="refunder", input="refund 200.00 on ord_1001")
    run_drive(run_id=run.id)
    run.refresh_from_db()
    assert run.status == "WAITING_FOR_APPROVAL" and readme_tool.ISSUED == {}


def test_the_shipped_cashier_validates_and_charges_through_the_example_app(tenant, settings):
    from examples.payments.fake_gateway import FakeGateway
    from examples.payments.models import ChargeJournal
    from runs.api.serializers import agent_definition_check

    steps = commands("readme-reconciler-commands")
    assert set(steps) == {"load_agent", "submit_run"}
    path = ROOT / steps["load_agent"][0]
    assert path == ROOT / "examples" / "payments" / "cashier.json"
    assert "PAYMENTS_TENANT=demo" in block("readme-reconciler-commands")  # the tenant the gateway charges for
    agent_definition_check(json.loads(path.read_text()))  # strict, as REST validates a definition

    gateway = FakeGateway().start()
    try:
        settings.PAYMENTS_GATEWAY_URL = gateway.url
        settings.PAYMENTS_TENANT = tenant.name  # the README's `PAYMENTS_TENANT=demo`, for the test tenant
        call_command("load_agent", str(path), *as_run_here(steps["load_agent"][1:], tenant), stdout=StringIO())
        run = submitted(steps["submit_run"], tenant)
        assert run_drive(run_id=run.id).kind.value == "completed"
    finally:
        gateway.close()
    run.refresh_from_db()
    assert run.status == "COMPLETED" and run.final_message == "Charged cus_42 12.50 EUR."
    call = ToolInvocation.objects.get(run=run)
    assert call.result["status"] == "succeeded" and call.result["amount_cents"] == 1250
    (entry,) = ChargeJournal.objects.all()
    assert (entry.idempotency_key, entry.state) == (call.idempotency_key, ChargeJournal.SUCCEEDED)
    assert [p["key"] for p in gateway.posts] == [call.idempotency_key]


def test_the_readme_reconciler_is_the_example_apps_own():
    from examples.payments import agent_tools

    def function(tree: ast.Module) -> str:
        node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "reconcile_charge")
        return ast.dump(node, include_attributes=False)

    shown = function(ast.parse(block("readme-reconciler")))
    assert shown == function(ast.parse((ROOT / "examples" / "payments" / "agent_tools.py").read_text()))
    assert REGISTRY.reconciler("charge_card") is agent_tools.reconcile_charge


def test_the_readme_provider_snippet_defines_what_it_uses_and_registers_acme():
    """README "Add your own model provider": the block names no undefined
    class (it once built an `AcmeProvider` it never defined), and run as
    written it registers an endpoint provider with its built-in endpoint."""
    from runs.providers.openai import OpenAIProvider
    from runs.providers.registry import PROVIDERS

    source = block("readme-provider")
    namespace: dict = {"__name__": "readme_provider_snippet"}
    snapshot = PROVIDERS.snapshot()
    try:
        # As its own module would be: without this file's `from __future__ import annotations`.
        exec(compile(source, "README.md", "exec", dont_inherit=True), namespace)  # noqa: S102 - our own README's code
        entry = PROVIDERS.snapshot()["acme"]
    finally:
        PROVIDERS.restore(snapshot)
    assert {name for name in free_names(source) if name not in namespace and not hasattr(builtins, name)} == set()
    assert issubclass(namespace["AcmeProvider"], OpenAIProvider) and namespace["AcmeProvider"].name == "acme"
    assert entry.endpoint and entry.streams and entry.base_url == "https://api.acme.example/v1"
    assert "acme" not in PROVIDERS.snapshot()  # nothing left behind
