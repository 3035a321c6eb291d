"""The approval's request hash: SHA-256 of the canonical JSON of
what the operator is shown and what would run. No Django imports."""

from __future__ import annotations

import hashlib
import json
from typing import Any

INTERRUPTED_NOTICE = (
    "This tool call started, and the process stopped before its outcome was recorded, so whether it took effect "
    "is unknown. Approving runs it again with these arguments; rejecting ends the run."
)

UNCERTAIN_NOTICE = (
    "This tool call was sent and no answer came (the connection was lost, or it timed out or was cancelled while "
    "running), so whether it took effect is unknown. Approving sends it again once with the same idempotency key; "
    "confirming records what you know happened without sending it; rejecting ends the run."
)


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode("utf-8")


def tool_spec_dict(spec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "description": spec.description,
        "parameters": spec.parameters,
        "schema_version": spec.schema_version,
        "side_effect": spec.side_effect,
        "timeout_seconds": spec.timeout_seconds,
    }


def request_hash(
    *,
    tenant_id,
    run_id,
    step_number: int,
    invocation_id,
    tool: dict[str, Any] | None,
    arguments: Any,
    agent_version: str,
    kind: str,
    presentation: dict[str, Any],
) -> str:
    return hashlib.sha256(
        canonical(
            {
                "tenant": str(tenant_id),
                "run": str(run_id),
                "step": step_number,
                "invocation": str(invocation_id) if invocation_id else None,
                "tool": tool,
                "arguments": arguments,
                "agent_version": agent_version,
                "kind": kind,
                "presentation": presentation,
            }
        )
    ).hexdigest()
