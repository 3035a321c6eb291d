"""The ApprovalGate port's adapter: builds hash-bound approval rows for the
pipeline and reads decisions back when the run resumes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings

from approvals.fork import fork_presentation
from approvals.hashing import request_hash, tool_spec_dict
from approvals.models import UNKNOWN_OUTCOME_KINDS, Approval
from runs.domain.records import ApprovalDecision
from runs.domain.writes import ApprovalInsert
from runs.tools.mcp.tools import shown

POLICY_NOTICE = (
    "Policy requires an operator's approval before this call runs. Approving runs it once with these arguments."
)


class ApprovalGate:
    """The `runs.domain.ports.ApprovalGate` adapter (checked structurally by mypy
    and by tests/unit/test_ports.py)."""

    def __init__(self, *, run, clock, ids):
        self.run = run
        self.clock = clock
        self.ids = ids

    def _expiry(self, now, kind: str):
        if kind in UNKNOWN_OUTCOME_KINDS:
            return None  # a re-run grant asked again is still an unknown outcome: no timer closes it
        expires = now + timedelta(seconds=float(settings.AGENTRT_APPROVAL_TTL_SECONDS))
        if self.run.deadline_at is not None and self.run.deadline_at < expires:
            expires = self.run.deadline_at
        return expires

    @staticmethod
    def presentation(tool, arguments) -> dict[str, Any]:
        return {
            "tool": tool.name,
            "arguments": arguments,
            "side_effect": tool.side_effect,
            "read_only": tool.read_only,
            "notice": POLICY_NOTICE,
        }

    def current_hash(self, *, step_number: int, invocation_id, tool, arguments, kind: str, presentation: dict) -> str:
        return request_hash(
            tenant_id=self.run.tenant_id,
            run_id=self.run.id,
            step_number=step_number,
            invocation_id=invocation_id,
            tool=tool_spec_dict(tool),
            arguments=arguments,
            agent_version=self.run.agent_version,
            kind=kind,
            presentation=presentation,
        )

    def request(
        self, *, step_number: int, invocation_id, tool, arguments, kind: str, at, call_index: int | None = None
    ) -> ApprovalInsert:
        return self._insert(
            step_number=step_number,
            invocation_id=invocation_id,
            tool=tool,
            arguments=arguments,
            kind=kind,
            # An MCP tool's server and its hints as pinned, labelled as hints (runs.tools.mcp): bound by the hash too.
            presentation=self._forked(
                {**self.presentation(tool, arguments), **shown(tool.name, self._definition())},
                step_number,
                call_index,
                invocation_id,
            ),
            capability={"tool": tool.name, "arguments": arguments},
            at=at,
        )

    def request_again(
        self, *, step_number: int, invocation_id, tool, arguments, previous: ApprovalDecision, at
    ) -> ApprovalInsert:
        """A new approval of a re-run grant's kind after it was invalidated:
        the previous presentation and capability, with what runs (tool,
        arguments, side-effect class) taken from the current spec."""
        return self._insert(
            step_number=step_number,
            invocation_id=invocation_id,
            tool=tool,
            arguments=arguments,
            kind=previous.kind,
            presentation={**(previous.presentation or {}), **rerun_shown(tool, arguments)},
            capability=dict(previous.capability or {}) or {"tool": tool.name, "arguments": arguments},
            at=at,
        )

    def _insert(
        self, *, step_number: int, invocation_id, tool, arguments, kind: str, presentation: dict, capability: dict, at
    ) -> ApprovalInsert:
        """The row for a new pending approval, its hash bound to exactly what it presents."""
        return ApprovalInsert(
            id=self.ids.new_id(),
            invocation_id=invocation_id,
            kind=kind,
            request_hash=self.current_hash(
                step_number=step_number,
                invocation_id=invocation_id,
                tool=tool,
                arguments=arguments,
                kind=kind,
                presentation=presentation,
            ),
            capability=capability,
            presentation=presentation,
            expires_at=self._expiry(at, kind),
            created_at=at,
        )

    def _definition(self) -> Any:
        return getattr(self.run, "pinned_definition", None)

    def _forked(self, presentation: dict, step_number: int, call_index: int | None, invocation_id) -> dict:
        """A fork's card also says what the original did at this position (approvals.fork)."""
        if getattr(self.run, "forked_from_id", None) is None:
            return presentation
        return fork_presentation(self.run, presentation, step_number, call_index, invocation_id)

    def decision_for(self, invocation_id) -> ApprovalDecision | None:
        row = (
            Approval.objects.filter(invocation_id=invocation_id)
            .order_by("-created_at")
            .values("id", "status", "kind", "request_hash", "presentation", "capability", "decided_at")
            .first()
        )
        return None if row is None else ApprovalDecision(**row)


def rerun_shown(tool, arguments) -> dict[str, Any]:
    """What a re-run approval always shows, whatever else it carries."""
    return {"tool": tool.name, "arguments": arguments, "side_effect": tool.side_effect}
