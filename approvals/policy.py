"""Policy evaluation (DESIGN §16): allow / deny / require_approval.

Rules match on the tool name with an optional `when` on an argument (dotted
path; ops eq, ne, in, gt, gte, lt, lte); the first match wins, else
`default`. An error while evaluating, or an argument the condition cannot
read, fails closed: require approval, never allow. No Django imports.
"""
from __future__ import annotations

from typing import Any

DECISIONS = ("allow", "deny", "require_approval")
OPS = ("eq", "ne", "in", "gt", "gte", "lt", "lte")
_MISSING = object()


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
    op, expected = when["op"], when.get("value")
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


def evaluate(policy: dict | None, tool_name: str, arguments: Any) -> str:
    policy = policy or {}
    try:
        for rule in policy.get("rules", []):
            if rule.get("tool") not in (tool_name, "*"):
                continue
            when = rule.get("when")
            if when is None or _matches(when, arguments):
                return rule["decision"]
        return policy.get("default", "allow")
    except Exception:
        return "require_approval"


class PolicyEngine:
    """The `PolicyEngine` port over one agent version's policy."""

    def __init__(self, policy: dict | None):
        self.policy = policy or {}

    def evaluate(self, tool_name: str, arguments: Any) -> str:
        decision = evaluate(self.policy, tool_name, arguments)
        return decision if decision in DECISIONS else "require_approval"
