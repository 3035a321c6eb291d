"""What a fork's approval card adds (the request hash covers the
presentation, so these facts are approved with the call): that the run is a
fork of run X at step N, and what X did at the same position — the same
call, the same tool with other arguments, another tool, or nothing."""

from __future__ import annotations

from typing import Any

from runs.models import ToolInvocation
from runs.store.lineage import recorded_calls

FORK_NOTICE = (
    "Every side effect of a fork waits for a person. Approving runs this call once with these arguments; nothing "
    "the original did is sent again."
)


def fork_presentation(
    run: Any, presentation: dict[str, Any], step_number: int, call_index: int | None, invocation_id: Any
) -> dict[str, Any]:
    """`presentation` with `fork` (the facts) and a notice that says them first."""
    if call_index is None:  # asked again for a call whose row is written: its position is on it
        call_index = ToolInvocation.objects.filter(id=invocation_id).values_list("call_index", flat=True).first()
    original = next((c for c in recorded_calls(run.forked_from_id, step_number) if c.call_index == call_index), None)
    tool, arguments = presentation.get("tool"), presentation.get("arguments")
    same_tool = original is not None and original.tool_name == tool
    same_arguments = same_tool and original is not None and original.arguments == arguments
    facts = {
        "run": str(run.forked_from_id),
        "step": run.forked_from_step,
        "position": {"step": step_number, "call_index": call_index},
        "original": None
        if original is None
        else {
            "tool": original.tool_name,
            "arguments": original.arguments if original.arguments is not None else original.raw_arguments,
            "status": original.status,
            "outcome": original.outcome,
        },
        "same_tool": same_tool,
        "same_arguments": same_arguments,
    }
    # A fork whose effects wait for a person asks because it is a fork, not because of a rule: it says so.
    why = FORK_NOTICE if run.fork_effects == "approve" else presentation.get("notice", "")
    return {**presentation, "fork": facts, "notice": f"{fork_notice(facts)} {why}".strip()}


def fork_notice(facts: dict[str, Any]) -> str:
    where = f"step {facts['position']['step']}, call {(facts['position']['call_index'] or 0) + 1}"
    head = f"This run is a fork of run {facts['run']} at step {facts['step']}; at this position ({where}) the original"
    original = facts["original"]
    if original is None:
        return f"{head} made no call."
    ended = f" (it ended {original['outcome'] or original['status']})"
    if facts["same_arguments"]:
        return f"{head} made the same call, with the same arguments{ended}. Approving makes it again."
    if facts["same_tool"]:
        return f"{head} called the same tool with other arguments{ended}."
    return f"{head} called another tool, {original['tool']}{ended}."
