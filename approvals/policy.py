"""Policy evaluation: allow / deny / require_approval.

Rules match on the tool name with an optional `when` on an argument (dotted
path; ops eq, ne, in, gt, gte, lt, lte); the first match wins, else
`default`. A rule with `"side_effect": true` matches only tools that are
not read-only (`false`: only read-only ones); a tool whose kind is unknown
counts as having a side effect. An error while evaluating, or an argument
the condition cannot read, fails closed: require approval, never allow.

A tenant's policy floor has the same shape. The decision for a call is the
stricter of the floor's and the agent's (deny > require_approval > allow),
so no agent can loosen what its tenant's floor says. No Django imports.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

DECISIONS = ("allow", "deny", "require_approval")
OPS = ("eq", "ne", "in", "gt", "gte", "lt", "lte")
_MISSING = object()
STRICTNESS = {"allow": 0, "require_approval": 1, "deny": 2}


class PolicyError(Exception):
    """The policy could not be evaluated; callers fail closed."""


def _lookup(arguments: Any, path: str) -> Any:
    value = arguments
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
    return value


def _matches(when: dict, arguments: Any) -> bool:
    value = _lookup(arguments, when["arg"])
    if value is _MISSING:
        raise PolicyError(f"argument {when['arg']!r} is missing")
    op = when["op"]
    expected: Any = when.get("value")
    if op == "eq":
        return value == expected
    if op == "ne":
        return value != expected
    if op == "in":
        return value in expected
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PolicyError(f"argument {when['arg']!r} is not a number")
    if op == "gt":
        return value > expected
    if op == "gte":
        return value >= expected
    if op == "lt":
        return value < expected
    if op == "lte":
        return value <= expected
    raise PolicyError(f"unknown op {op!r}")


def stricter(a: str, b: str) -> str:
    """The stricter of two decisions; anything unknown counts as require_approval."""
    a = a if a in STRICTNESS else "require_approval"
    b = b if b in STRICTNESS else "require_approval"
    return a if STRICTNESS[a] >= STRICTNESS[b] else b


def evaluate(policy: dict | None, tool_name: str, arguments: Any, *, read_only: bool | None = None) -> str:
    policy = policy or {}
    try:
        for rule in policy.get("rules", []):
            if rule.get("tool") not in (tool_name, "*"):
                continue
            wanted = rule.get("side_effect")
            if wanted is not None and bool(wanted) != (read_only is not True):
                continue
            when = rule.get("when")
            if when is None or _matches(when, arguments):
                return rule["decision"]
        return policy.get("default", "allow")
    except Exception:
        return "require_approval"


class PolicyEngine:
    """The `PolicyEngine` port over one agent version's policy, its ancestors'
    (`inherited`: a child run's parents', nearest first) and its tenant's floor.

    `floor` is called at every evaluation that could be tightened by it (the
    executor's reader reads the tenant row once per step, so a tightened
    floor applies at the next step of every run); `read_only_of`
    tells whether a tool is read-only (None: unknown)."""

    def __init__(
        self,
        policy: dict | None,
        *,
        floor: Callable[[], dict | None] | None = None,
        read_only_of: Callable[[str], bool | None] | None = None,
        inherited: list[dict] | tuple[dict, ...] = (),
    ):
        self.policy = policy or {}
        self.floor = floor
        self.read_only_of = read_only_of
        # A child run's ancestors' policies (their pinned versions'): a child is never less restricted than
        # any run above it, so each of them is one more policy the decision is the stricter of.
        self.inherited = [p or {} for p in inherited]

    def _own(self, tool_name: str, arguments: Any) -> tuple[str, bool | None]:
        """The agent's own decision, and whether the tool is read-only."""
        try:
            read_only = self.read_only_of(tool_name) if self.read_only_of else None
        except Exception:
            read_only = None
        decision = evaluate(self.policy, tool_name, arguments, read_only=read_only)
        decision = decision if decision in DECISIONS else "require_approval"
        for policy in self.inherited:
            if decision == "deny":
                break
            decision = stricter(decision, evaluate(policy, tool_name, arguments, read_only=read_only))
        return decision, read_only

    def evaluate(self, tool_name: str, arguments: Any) -> str:
        decision, read_only = self._own(tool_name, arguments)
        if self.floor is None or decision == "deny":  # nothing is stricter than deny: no need to read the floor
            return decision
        try:
            floor = self.floor()
        except Exception:  # the floor could not be read: fail closed
            return stricter(decision, "require_approval")
        return stricter(decision, evaluate(floor, tool_name, arguments, read_only=read_only))

    def evaluate_under(self, tool_name: str, arguments: Any, floor: dict | None) -> str:
        """The decision under the floor given (read in the caller's transaction)."""
        decision, read_only = self._own(tool_name, arguments)
        if decision == "deny":
            return decision
        return stricter(decision, evaluate(floor, tool_name, arguments, read_only=read_only))


class PersonFirst:
    """The policy of a fork whose side effects wait for a person (`effects:
    "approve"`): a call that could touch the world — a tool that is not
    read-only (or whose kind is unknown) and `delegate_run` (a child could) —
    needs an approval whatever the run's own policy allows, and a deny stays a
    deny. It wraps the engine the run would have had (its floor, its
    inherited policies), which still decides every other call."""

    def __init__(self, engine: Any, *, needs_person: Callable[[str], bool]):
        self.engine = engine
        self.needs_person = needs_person

    def _gated(self, tool_name: str, decision: str) -> str:
        if decision == "deny":
            return decision
        try:
            person = self.needs_person(tool_name)
        except Exception:  # the tool's kind could not be read: it may have an effect
            person = True
        return "require_approval" if person else decision

    def evaluate(self, tool_name: str, arguments: Any) -> str:
        return self._gated(tool_name, self.engine.evaluate(tool_name, arguments))

    def evaluate_under(self, tool_name: str, arguments: Any, floor: dict | None) -> str:
        return self._gated(tool_name, self.engine.evaluate_under(tool_name, arguments, floor))
