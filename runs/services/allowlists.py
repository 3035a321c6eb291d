"""Per-tenant allow-lists of tools and model endpoints.

Tools and model endpoints are deployment-wide: a team's own tool (its
`agent_tools` module) and every operator endpoint with its key exist for
every tenant. `Tenant.allowed_tools` and `Tenant.allowed_endpoints` narrow
that per tenant: JSON lists of names, null meaning every one (what a
single-team deployment wants, and what every tenant had before).

The lists are checked twice:

- when an agent version is published (`agent_load`: REST, `load_agent`, the
  demo; every path that creates a version): a tool outside the list is 400
  `tool_not_allowed` naming `tools`, an endpoint outside it 400
  `endpoint_not_allowed` naming `model`;
- when a run executes (read with the claimed run, runs/runtime/wiring.py): a
  call of a tool no longer allowed is a failed result `tool_not_allowed` the
  model sees, nothing executed (runs/domain/pipeline/decide.py); an endpoint no
  longer allowed fails the run `endpoint_not_allowed` before the model is
  called. A child run runs under its parent's tenant: the same lists.

`allowed_endpoints` restricts the blocks of providers that call an
operator-configured endpoint (`openai`, `anthropic`, a project's provider
registered with `endpoint=True`); `scripted`, which calls nothing, is not
an endpoint.
"""

from __future__ import annotations

from typing import Any

from runs.errors import EndpointNotAllowed, InvalidInput, ToolNotAllowed
from runs.models import Tenant
from runs.providers import endpoint_name
from runs.providers.endpoints import configured
from runs.tools import REGISTRY

FIELDS = {"tools": "allowed_tools", "endpoints": "allowed_endpoints"}


def known(kind: str) -> list[str]:
    """The names a list of `kind` ("tools" or "endpoints") may hold: what this process has registered/configured."""
    return sorted(REGISTRY.names()) if kind == "tools" else sorted(configured())


def names_check(value: Any, kind: str) -> list[str] | None:
    """A tenant's list in canonical form (null stays null; names in the order
    given, each once), or InvalidInput naming the field
    (`allowed_tools` / `allowed_endpoints`) and every unknown name."""
    field = FIELDS[kind]
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise InvalidInput(
            f"{field} must be a list of names or null", fields={field: ["must be a list of names, or null for all"]}
        )
    names = list(dict.fromkeys(name.strip() for name in value))
    if any(not name for name in names):
        raise InvalidInput(f"{field} holds an empty name", fields={field: ["names must not be empty"]})
    available = known(kind)
    unknown = [name for name in names if name not in available]
    if unknown:
        what = "tool is registered" if kind == "tools" else "model endpoint is configured"
        message = f"no {what} named {', '.join(map(repr, unknown))} (known: {', '.join(available) or 'none'})"
        raise InvalidInput(f"{field}: {message}", fields={field: [message]})
    return names


def lists_of(tenant: Tenant) -> tuple[list[str] | None, list[str] | None]:
    """The tenant's (allowed_tools, allowed_endpoints) as they are now (read
    from its row, not from an instance that may predate a change)."""
    row = Tenant.objects.filter(id=tenant.id).values_list("allowed_tools", "allowed_endpoints").first()
    return (row[0], row[1]) if row else (None, None)


def publish_check(tenant: Tenant, definition: dict[str, Any]) -> None:
    """Refuse a (validated, canonical) agent definition that names a tool or
    an endpoint outside its tenant's lists: `ToolNotAllowed` naming `tools`,
    `EndpointNotAllowed` naming `model`."""
    tools, endpoints = lists_of(tenant)
    if tools is not None:
        refused = [name for name in definition.get("tools") or () if name not in tools]
        if refused:
            message = (
                f"not allowed for tenant {tenant.name!r}: {', '.join(refused)} "
                f"(its tools: {', '.join(tools) or 'none'})"
            )
            raise ToolNotAllowed(f"invalid agent definition: tools: {message}", fields={"tools": [message]})
    if endpoints is not None:
        name = endpoint_name(definition.get("model") or {})
        if name is not None and name not in endpoints:
            message = (
                f"the model endpoint {name!r} is not allowed for tenant {tenant.name!r} "
                f"(its endpoints: {', '.join(endpoints) or 'none'})"
            )
            raise EndpointNotAllowed(f"invalid agent definition: model: {message}", fields={"model": [message]})
