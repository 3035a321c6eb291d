"""`approvals.policy.evaluate`: rules on the tool name with an optional `when`
on an argument; first match wins; fails closed. No database."""

from __future__ import annotations

import pytest

from approvals.policy import PolicyEngine, evaluate


def rule(op, value, decision="deny", arg="amount", tool="pay"):
    return {"tool": tool, "when": {"arg": arg, "op": op, "value": value}, "decision": decision}


@pytest.mark.parametrize(
    "op, value, argument, matches",
    [
        ("eq", 5, 5, True),
        ("eq", 5, 6, False),
        ("eq", "x", "x", True),
        ("ne", 5, 6, True),
        ("ne", 5, 5, False),
        ("in", ["a", "b"], "b", True),
        ("in", ["a", "b"], "c", False),
        ("gt", 10, 11, True),
        ("gt", 10, 10, False),
        ("gte", 10, 10, True),
        ("gte", 10, 9.5, False),
        ("lt", 10, 9, True),
        ("lt", 10, 10, False),
        ("lte", 10, 10, True),
        ("lte", 10, 10.01, False),
    ],
)
def test_each_op_decides_whether_the_rule_matches(op, value, argument, matches):
    policy = {"rules": [rule(op, value, "deny")], "default": "allow"}

    assert evaluate(policy, "pay", {"amount": argument}) == ("deny" if matches else "allow")


def test_first_matching_rule_wins():
    policy = {
        "rules": [
            rule("gt", 1000, "deny"),
            rule("gt", 100, "require_approval"),
            {"tool": "pay", "decision": "allow"},
        ],
        "default": "deny",
    }

    assert evaluate(policy, "pay", {"amount": 5000}) == "deny"
    assert evaluate(policy, "pay", {"amount": 500}) == "require_approval"
    assert evaluate(policy, "pay", {"amount": 5}) == "allow"


def test_rules_for_other_tools_are_skipped_and_star_matches_any_tool():
    policy = {
        "rules": [{"tool": "other", "decision": "allow"}, {"tool": "*", "decision": "require_approval"}],
        "default": "deny",
    }

    assert evaluate(policy, "pay", {}) == "require_approval"
    assert evaluate(policy, "other", {}) == "allow"


def test_no_matching_rule_gives_the_default():
    assert evaluate({"rules": [rule("eq", 1)], "default": "deny"}, "pay", {"amount": 2}) == "deny"
    assert evaluate({"rules": [], "default": "require_approval"}, "pay", {}) == "require_approval"


def test_no_policy_or_no_default_allows():
    assert evaluate(None, "pay", {"amount": 1}) == "allow"
    assert evaluate({}, "pay", {}) == "allow"
    assert evaluate({"rules": [rule("eq", 1)]}, "pay", {"amount": 2}) == "allow"


def test_dotted_path_reads_nested_objects_and_list_indexes():
    policy = {"rules": [rule("eq", "prod", "deny", arg="target.envs.1")], "default": "allow"}

    assert evaluate(policy, "pay", {"target": {"envs": ["dev", "prod"]}}) == "deny"
    assert evaluate(policy, "pay", {"target": {"envs": ["dev", "test"]}}) == "allow"


@pytest.mark.parametrize("arguments", [{}, {"other": 1}, {"amount": {"nested": 1}}, None])
def test_missing_argument_fails_closed_to_require_approval(arguments):
    policy = {"rules": [rule("eq", 1, "allow", arg="amount.value")], "default": "allow"}

    assert evaluate(policy, "pay", arguments) == "require_approval"


@pytest.mark.parametrize("value", ["100", None, True, [1], {"n": 1}])
def test_a_non_number_in_a_numeric_comparison_fails_closed(value):
    policy = {"rules": [rule("gt", 10, "allow")], "default": "allow"}

    assert evaluate(policy, "pay", {"amount": value}) == "require_approval"


def test_an_unknown_op_fails_closed():
    assert (
        evaluate({"rules": [rule("approx", 10, "allow")], "default": "allow"}, "pay", {"amount": 10})
        == "require_approval"
    )


def test_a_rule_without_decision_fails_closed():
    assert evaluate({"rules": [{"tool": "pay"}], "default": "allow"}, "pay", {}) == "require_approval"


def test_engine_turns_an_unknown_decision_into_require_approval():
    engine = PolicyEngine({"rules": [{"tool": "pay", "decision": "maybe"}], "default": "allow"})

    assert engine.evaluate("pay", {}) == "require_approval"
    assert engine.evaluate("other", {}) == "allow"
    assert PolicyEngine(None).evaluate("pay", {}) == "allow"
