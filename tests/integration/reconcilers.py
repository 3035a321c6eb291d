"""Reconcilers for tests/integration/test_reconcile_simulated_crash.py and
tests/fault/test_kill_points.py, named by dotted path in
settings.AGENTRT_RECONCILER (DESIGN §16 "Reconciler").

Each records the RunView it was given in SEEN, so a test can check what the
reconciler saw. Resume calls them on a thread of its own."""

from __future__ import annotations

import threading
from collections import namedtuple
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

SEEN: list[Any] = []
RELEASE = threading.Event()  # lets the slow reconciler return once its test is over
SECRET = "kaboom-7f3a: raw reconciler exception text that must not leak"

PAUSE = {
    "outcome": "require_approval",
    "capability": {"tool": "http_post", "scope": "payments", "check": "ledger-lookup"},
    "presentation": {"title": "Payment outcome unknown", "ledger": "no entry for this idempotency key", "amount": 5},
}
RESULT = {"paid": True, "receipt": "r-42", "amounts": [5], "note": None}
DETAIL = "ledger shows payment p-42 refunded while the record says it was sent"


def _seen(view):
    SEEN.append(view)


# -- continue / completed / conflict -----------------------------------------


def always_continue(view):
    _seen(view)
    return {"outcome": "continue"}


def completed_json(view):
    _seen(view)
    return {"outcome": "completed", "result": RESULT}


def completed_list(view):
    return {"outcome": "completed", "result": [1, "two", {"three": 3}]}


def completed_string(view):
    return {"outcome": "completed", "result": "already paid"}


def completed_zero(view):
    return {"outcome": "completed", "result": 0}


def completed_object(view):
    return {"outcome": "completed", "result": object()}


def completed_nan(view):
    return {"outcome": "completed", "result": float("nan")}


def completed_inf_inside(view):
    return {"outcome": "completed", "result": {"amount": float("inf")}}


def completed_set(view):
    return {"outcome": "completed", "result": {"ids": {1, 2}}}


def completed_missing(view):
    return {"outcome": "completed"}


def conflict_with_detail(view):
    _seen(view)
    return {"outcome": "conflict", "detail": DETAIL}


def conflict_without_detail(view):
    return {"outcome": "conflict"}


# -- waiting --------------------------------------------------------------------


def waiting(view):
    _seen(view)
    return {"outcome": "waiting", "pause": PAUSE}


def waiting_without_pause(view):
    return {"outcome": "waiting"}


def waiting_pause_deny(view):
    return {"outcome": "waiting", "pause": {**PAUSE, "outcome": "deny"}}


def waiting_pause_allow(view):
    return {"outcome": "waiting", "pause": {**PAUSE, "outcome": "allow"}}


def waiting_capability_list(view):
    return {"outcome": "waiting", "pause": {**PAUSE, "capability": ["http_post", "payments"]}}


def waiting_capability_string(view):
    return {"outcome": "waiting", "pause": {**PAUSE, "capability": "http_post"}}


def waiting_capability_not_json(view):
    return {"outcome": "waiting", "pause": {**PAUSE, "capability": {"tool": "http_post", "handle": object()}}}


def waiting_presentation_not_json(view):
    return {"outcome": "waiting", "pause": {**PAUSE, "presentation": {"amount": float("nan")}}}


def waiting_presentation_list(view):
    return {"outcome": "waiting", "pause": {**PAUSE, "presentation": ["not", "a", "mapping"]}}


# -- answers that are not a Reconciliation ---------------------------------------


def unknown_outcome(view):
    return {"outcome": "retry"}


def no_outcome(view):
    return {"result": RESULT}


def returns_42(view):
    return 42


def returns_none(view):
    return None


def returns_string(view):
    return "continue"


def raises(view):
    raise RuntimeError(SECRET)


def raises_system_exit(view):
    raise SystemExit(SECRET)


def raises_keyboard_interrupt(view):
    raise KeyboardInterrupt(SECRET)


def slow(view):
    """Answers only after its test releases it (well past the timeout)."""
    _seen(view)
    RELEASE.wait(30)
    return {"outcome": "completed", "result": {"late": True}}


# -- the view is read-only -----------------------------------------------------


def assigns_view(view):
    view.run = {"status": "COMPLETED"}  # a frozen model refuses: this raises
    return {"outcome": "continue"}


def _mutate(view):
    view.run["status"] = "COMPLETED"
    view.run["result"] = {"forged": True}
    view.run["final_message"] = "forged"
    for inv in view.invocations:
        inv["status"] = "completed"
        inv["result"] = {"forged": True}
        inv["arguments"]["json"]["amount"] = 5000
        inv["arguments"]["url"] = "http://evil.invalid/"
    for step in view.steps:
        step["status"] = "failed"
    view.steps.clear()
    view.invocations.append({"id": "forged"})
    view.approvals.append({"id": "forged", "kind": "policy", "status": "approved"})


def mutates_then_continue(view):
    _mutate(view)
    return {"outcome": "continue"}


def mutates_then_waiting(view):
    _mutate(view)
    return {"outcome": "waiting", "pause": PAUSE}


# -- a Reconciliation as an object with attributes -------------------------------


class Reconciliation:
    def __init__(self, outcome, result=None, pause=None, detail=""):
        self.outcome = outcome
        self.result = result
        self.pause = pause
        self.detail = detail


@dataclass
class ReconciliationData:
    outcome: str
    result: Any = None
    pause: Any = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ReconciliationSlots:
    outcome: str
    result: Any = None
    pause: Any = None
    detail: str = ""


ReconciliationTuple = namedtuple("ReconciliationTuple", "outcome result pause detail", defaults=(None, None, ""))


class ReconciliationProperties:
    """Attributes served by properties (no instance __dict__ entries)."""

    @property
    def outcome(self):
        return "completed"

    @property
    def result(self):
        return RESULT

    pause = None
    detail = ""


class Pause:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def object_completed(view):
    return Reconciliation("completed", result=RESULT)


def object_conflict(view):
    return Reconciliation("conflict", detail=DETAIL)


def object_continue(view):
    return Reconciliation("continue")


def object_waiting(view):
    return Reconciliation("waiting", pause=Pause(**PAUSE))


def dataclass_completed(view):
    return ReconciliationData("completed", result=RESULT)


def namespace_completed(view):
    return SimpleNamespace(outcome="completed", result=RESULT, pause=None, detail="")


def slots_completed(view):
    return ReconciliationSlots("completed", result=RESULT)


def namedtuple_completed(view):
    return ReconciliationTuple("completed", result=RESULT)


def properties_completed(view):
    return ReconciliationProperties()


def pydantic_completed(view):
    from pydantic import BaseModel

    class Answer(BaseModel):
        outcome: str
        result: Any = None
        pause: Any = None
        detail: str = ""

    return Answer(outcome="completed", result=RESULT)
