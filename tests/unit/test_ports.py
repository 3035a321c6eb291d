"""The adapters wired at the composition root match the domain's ports: the
same methods with the same keyword names (a renamed keyword would only fail
when that path runs)."""

from __future__ import annotations

import inspect

import pytest

from approvals.gate import ApprovalGate as GateAdapter
from runs.domain import ports

METHODS = ["request", "request_again", "current_hash", "decision_for"]


def _parameters(obj, name: str) -> list[tuple[str, object]]:
    params = list(inspect.signature(getattr(obj, name)).parameters.values())
    return [(p.name, p.kind) for p in params if p.name != "self"]


@pytest.mark.parametrize("method", METHODS)
def test_the_approval_gate_adapter_has_the_ports_methods_and_keywords(method):
    assert _parameters(GateAdapter, method) == _parameters(ports.ApprovalGate, method)


def test_the_port_names_every_method_the_pipeline_calls():
    declared = {n for n, v in vars(ports.ApprovalGate).items() if callable(v) and not n.startswith("_")}
    assert declared == set(METHODS)
