"""Agent services: publish a definition as a new version (its hash)."""

from __future__ import annotations

import hashlib
from typing import Any

from django.db import transaction
from pydantic import ValidationError

from runs.clock import CLOCK, IDS
from runs.domain.context import canonical_json
from runs.errors import InvalidInput
from runs.models import Agent, AgentVersion, Tenant
from runs.services.agent_schema import AgentDefinition, forbidden_model_keys
from runs.services.allowlists import publish_check
from runs.services.validation import pydantic_fields
from runs.tools import mcp


def agent_load(*, tenant: Tenant, definition: Any, published_by=None) -> AgentVersion:
    """Create or update an agent; its version is the hash of its definition.

    Callers authorize: REST requires `runs.publish_agent`; `load_agent` is
    the operator's shell. `published_by` (None for the shell) and
    `published_at` are recorded on a new version. A tool or a model endpoint
    outside the tenant's allow-lists is refused (`ToolNotAllowed` naming
    `tools`, `EndpointNotAllowed` naming `model`), whoever publishes. The
    MCP tools it names are listed by their servers now and pinned into the
    version (`mcp_tools`, runs/tools/mcp/pin.py); a server that cannot be
    listed, or does not list the tool, is refused naming `tools`."""
    if not isinstance(definition, dict):
        raise InvalidInput("the agent definition must be a JSON object", fields={"(root)": ["must be an object"]})
    if mcp.DEFINITION_KEY in definition:  # a pin is what the server listed at publish, never what a publisher says
        message = "set when a version is published, from the MCP servers' listings; not part of a definition"
        raise InvalidInput(
            f"invalid agent definition: {mcp.DEFINITION_KEY}: {message}", fields={mcp.DEFINITION_KEY: [message]}
        )
    forbidden = forbidden_model_keys(definition)  # a definition never chooses where a key goes
    try:
        parsed = AgentDefinition.model_validate(definition)
    except ValidationError as exc:
        fields = {**pydantic_fields(exc), **forbidden}
        first = next(iter(forbidden.items())) if forbidden else next(iter(fields.items()))
        raise InvalidInput(f"invalid agent definition: {first[0]}: {first[1][0]}", fields=fields) from None
    if forbidden:
        first = next(iter(forbidden.items()))
        raise InvalidInput(f"invalid agent definition: {first[0]}: {first[1][0]}", fields=forbidden)
    normal = parsed.normal()
    publish_check(tenant, normal)  # the tenant's allowed_tools / allowed_endpoints (tool_not_allowed, ...)
    try:  # each MCP tool's listing, fetched now and pinned into the version (its hash covers it)
        pins = mcp.pins_for(normal["tools"])
    except mcp.PinFailed as exc:
        raise InvalidInput(f"invalid agent definition: tools: {exc}", fields={"tools": [str(exc)]}) from None
    if pins:
        normal[mcp.DEFINITION_KEY] = pins
    version = hashlib.sha256(canonical_json(normal).encode()).hexdigest()
    policy_version = hashlib.sha256(canonical_json(normal["policy"]).encode()).hexdigest()[:16]
    now = CLOCK.now()
    with transaction.atomic(durable=True):
        agent = Agent.objects.select_for_update().filter(tenant=tenant, name=parsed.name).first()
        if agent is None:
            agent = Agent.objects.create(
                id=IDS.new_id(), tenant=tenant, name=parsed.name, latest_version=version, created_at=now, updated_at=now
            )
        else:
            Agent.objects.filter(id=agent.id).update(latest_version=version, updated_at=now)
        av, _ = AgentVersion.objects.get_or_create(
            agent=agent,
            version=version,
            defaults={
                "id": IDS.new_id(),
                "tenant": tenant,
                "definition": normal,
                "policy_version": policy_version,
                "created_at": now,
                "published_by": published_by,
                "published_at": now,
            },
        )
    return av
