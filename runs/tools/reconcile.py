"""Per-tool reconcilers.

A tool may be registered with `reconciler=fn`. When a run resumes with calls
whose outcome is unknown (interrupted or uncertain side effects) and
`AGENTRT_RECONCILER` is not set, and *every* such call's tool has a
reconciler, Resume asks them (`by_tool`) instead of pausing for an operator.
A call whose tool has none keeps the default: the operator decides.

`fn(view, invocation)` gets the `RunView` (copies) and the invocation's
dict (`tool_name`, `arguments`, `idempotency_key`, `status`, ...) and returns
a `Reconciliation` (or a dict / any object with those attributes):

* `completed` with a JSON `result`: the run completes with that result;
* `continue`: the agent sees the call as interrupted and goes on;
* `waiting` with a `pause` (a `require_approval` decision): an operator decides;
* `conflict` with a `detail`: the run fails `reconcile_conflict`.

With several unknown calls the strongest answer wins: conflict, then
waiting, then completed, then continue.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from runs.tools.registry import REGISTRY

UNKNOWN_STATUSES = ("interrupted", "uncertain")
_STRENGTH = {"conflict": 0, "waiting": 1, "completed": 2, "continue": 3}


class Pause(BaseModel):
    """A `require_approval` decision to pause on, as a policy returns it."""

    model_config = ConfigDict(extra="forbid")

    outcome: Literal["require_approval"] = "require_approval"
    capability: dict[str, Any] = Field(default_factory=dict)
    presentation: dict[str, Any] = Field(default_factory=dict)


class Reconciliation(BaseModel):
    """A reconciler's answer."""

    model_config = ConfigDict(extra="forbid")

    outcome: Literal["completed", "continue", "waiting", "conflict"]
    result: Any = None
    pause: Pause | None = None
    detail: str = ""


def unknown_calls(invocations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The side-effect calls whose outcome is unknown (no result recorded)."""
    return [
        inv
        for inv in invocations
        if inv.get("status") in UNKNOWN_STATUSES and not inv.get("read_only") and inv.get("result") is None
    ]


def covers(tool_names: list[str]) -> bool:
    """True when there is at least one call and every call's tool has a reconciler."""
    return bool(tool_names) and all(REGISTRY.reconciler(name) is not None for name in tool_names)


def _outcome(answer: Any) -> Any:
    if isinstance(answer, dict):
        return answer.get("outcome")
    return getattr(answer, "outcome", None)


def by_tool(view: Any) -> Any:
    """The reconciler Resume uses when the tools answer for themselves."""
    answers = []
    for invocation in unknown_calls(view.invocations):
        fn = REGISTRY.reconciler(invocation.get("tool_name") or "")
        if fn is None:
            raise LookupError(f"tool {invocation.get('tool_name')!r} has no reconciler")
        answer = fn(view, dict(invocation))
        if _outcome(answer) not in _STRENGTH:
            return answer  # Resume fails the run: an outcome outside the four
        answers.append(answer)
    if not answers:
        return Reconciliation(outcome="continue")
    return min(answers, key=lambda a: _STRENGTH[_outcome(a)])
