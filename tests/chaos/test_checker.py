"""The chaos checker's own tests: each rule is fed a synthetic history that
violates it (and must be caught) and one that respects it (and must pass).

The history below is one run, killed between the watermark and the result of
its only side effect, taken over (epoch 1 -> 2), parked on an
interrupted_side_effect approval, approved by the operator, re-claimed (epoch
3), re-sent once and completed. Transaction ids (`xid`) mimic PostgreSQL's
xmin: the takeover is transaction 20, the approval 30.
"""

from __future__ import annotations

import copy

import pytest

from tests.chaos.checker import check

RUN, SESS, INV, INV2, APPROVAL = "r1", "s1", "i1", "i2", "a1"
KEY, KEY2 = "r1:1:call_1_0", "r1:2:call_2_0"
BODY = {"run": 0, "step": 1, "n": 0}


def ev(seq, typ, epoch, xid, **payload):
    return {
        "session_id": SESS,
        "sequence": seq,
        "run_id": RUN,
        "type": typ,
        "payload": payload,
        "lease_epoch": epoch,
        "occurred_at": 100.0 + seq,
        "xid": xid,
    }


def history():
    events = [
        ev(1, "run.created", 0, 10),
        ev(2, "run.claimed", 1, 11, lease_epoch=1),
        ev(3, "tool.call.started", 1, 12),
        ev(4, "lease.taken_over", 2, 20, previous_epoch=1, lease_epoch=2, via="sweep"),
        ev(5, "step.interrupted", 2, 20, phase="executing", read_only=False, invocation=INV, outcome="unknown"),
        ev(6, "run.waiting_for_approval", 2, 21, kind="interrupted_side_effect"),
        ev(7, "approval.resolved", 2, 30, approval=APPROVAL),
        ev(8, "run.requeued", 2, 30, reason="approval"),
        ev(9, "run.claimed", 3, 31, lease_epoch=3),
        ev(10, "run.completed", 3, 40),
    ]
    snapshot = {
        "runs": [
            {
                "id": RUN,
                "status": "COMPLETED",
                "session_id": SESS,
                "lease_owner": None,
                "lease_epoch": 3,
                "lease_expires_at": None,
                "lease_expirations": 1,
                "attempts": 3,
                "failure": None,
                "cancel_requested_at": None,
                "submitted_at": 100.0,
                "plan": "kill@after_watermark",
            }
        ],
        "sessions": [{"id": SESS, "event_seq": 10}],
        "events": events,
        "invocations": [
            {
                "id": INV,
                "run_id": RUN,
                "step_number": 1,
                "call_index": 0,
                "tool_name": "http_post",
                "read_only": False,
                "status": "completed",
                "effect_sent_at": 131.0,
                "attempt": 2,
                "has_result": True,
                "idempotency_key": KEY,
                "lease_epoch": 3,
                "suspended_kind": None,
                "xid": 35,
            }
        ],
        "model_calls": [
            {
                "run_id": RUN,
                "step_number": 1,
                "attempt_number": 1,
                "status": "interrupted",
                "lease_epoch": 1,
                "xid": 20,
            },
            {"run_id": RUN, "step_number": 2, "attempt_number": 1, "status": "completed", "lease_epoch": 3, "xid": 36},
        ],
        "checkpoints": [
            {"run_id": RUN, "version": 1, "trigger": "step", "lease_epoch": 1, "xid": 12},
            {"run_id": RUN, "version": 2, "trigger": "final", "lease_epoch": 3, "xid": 40},
        ],
        "approvals": [
            {
                "id": APPROVAL,
                "run_id": RUN,
                "invocation_id": INV,
                "kind": "interrupted_side_effect",
                "status": "approved",
                "decided_at": 130.0,
                "decided_via": "api",
                "attempt": 1,
                "created_at": 106.0,
            }
        ],
        "meta": {"runs_submitted": 1, "t_first_submit": 100.0, "max_lease_expirations": 3},
    }
    sink = [send(KEY, 1, 110.0), send(KEY, 2, 131.0)]
    faults = [
        {
            "id": 1,
            "kind": "kill",
            "source": "planned",
            "plan": "kill@after_watermark",
            "t_freeze": 103.5,
            "held": [{"run": RUN, "epoch": 1, "window": "watermark_to_result", "invocation": INV, "attempt": 1}],
        }
    ]
    decisions = [
        {
            "approval": APPROVAL,
            "run": RUN,
            "kind": "interrupted_side_effect",
            "decision": "approve",
            "ok": True,
            "expect": "ok",
        }
    ]
    return snapshot, sink, faults, decisions


def send(key, attempt, t, body=BODY):
    from tests.chaos.checker import _sha

    return {
        "key": key,
        "attempt": str(attempt),
        "path": "/effect",
        "body": body,
        "body_sha256": _sha(body),
        "t_ns": int(t * 1e9),
        "mono_ns": int(t * 1e9),
    }


def run_check(snapshot, sink, faults, decisions):
    return check(snapshot, sink, faults, decisions)


def invariants(report):
    return sorted({v["invariant"] for v in report["violations"]})


def test_the_history_that_respects_every_rule_passes():
    report = run_check(*history())
    assert report["violations"] == []
    assert report["outcomes"] == {"COMPLETED": {"n": 1, "explained": 1, "unexplained": 0, "why": {"completed": 1}}}
    assert report["fencing"] == {"rows_checked": 15, "xid": True}
    assert report["i8"]["equal"] is True and report["i8"]["matched"] == 1
    assert report["sends"]["delivered_more_than_once"] == 1


# -- I1: outcomes, not termination ------------------------------------------------------


def test_i1_a_run_the_takeover_failed_internal_error_is_a_violation_not_a_terminal_state():
    snapshot, sink, faults, decisions = history()
    snapshot["runs"][0].update(status="FAILED", failure={"reason": "internal_error"})
    report = run_check(snapshot, sink, faults, decisions)
    assert "I1" in invariants(report)
    assert report["outcomes"]["FAILED:internal_error"]["unexplained"] == 1
    assert report["failure_reasons"] == {"internal_error": 1}


def test_i1_cancelled_only_after_a_recorded_cancel():
    snapshot, sink, faults, decisions = history()
    snapshot["runs"][0]["status"] = "CANCELLED"
    assert "I1" in invariants(run_check(snapshot, sink, faults, decisions))
    faults.append({"id": 2, "kind": "cancel", "source": "random", "run": RUN, "t": 120.0})
    report = run_check(snapshot, sink, faults, decisions)
    assert not [v for v in report["violations"] if v["invariant"] == "I1"]
    assert report["outcomes"]["CANCELLED"]["explained"] == 1


def test_i1_operator_rejected_only_after_an_operator_rejection():
    snapshot, sink, faults, decisions = history()
    snapshot["runs"][0].update(status="FAILED", failure={"reason": "operator_rejected"})
    assert "I1" in invariants(run_check(snapshot, sink, faults, decisions))  # the approval was approved, not rejected
    snapshot["approvals"][0]["status"] = "rejected"
    decisions[0]["decision"] = "reject"
    report = run_check(snapshot, sink[:1], faults, decisions)
    assert not [v for v in report["violations"] if v["invariant"] == "I1"], report["violations"]
    assert report["outcomes"]["FAILED:operator_rejected"] == {
        "n": 1,
        "explained": 1,
        "unexplained": 0,
        "why": {"the operator rejected its approval": 1},
    }


def completed_violations(report):
    return [v for v in report["violations"] if v["invariant"] == "I1" and "ended COMPLETED" in v["detail"]]


@pytest.mark.parametrize("recorded", ["approval row and operator log", "approval row only", "operator log only"])
def test_i1_completed_is_judged_a_run_whose_side_effect_the_operator_rejected_cannot_complete(recorded):
    """The operator rejected the interrupted side effect the run's plan needs
    (a rejection ends the run FAILED operator_rejected): that it COMPLETED
    anyway is a violation, not an end "explained" by completing
    (tests/mutants/checker_explains_every_completion.toml)."""
    snapshot, sink, faults, decisions = history()
    if recorded != "operator log only":
        snapshot["approvals"][0]["status"] = "rejected"
    if recorded == "approval row only":
        decisions = []  # a report made without the operator's log
    else:
        decisions[0]["decision"] = "reject"
    report = run_check(snapshot, sink[:1], faults, decisions)  # the approved re-send never happened
    [violation] = completed_violations(report)
    assert violation["run"] == RUN and "rejected" in violation["detail"] and APPROVAL in violation["detail"]
    assert report["outcomes"]["COMPLETED"]["unexplained"] == 1
    assert report["outcomes"]["COMPLETED"]["explained"] == 0


def test_i1_completed_is_judged_an_unknown_outcome_nobody_decided_cannot_complete():
    snapshot, sink, faults, _ = history()
    snapshot["approvals"][0].update(status="pending", decided_at=None)
    report = run_check(snapshot, sink[:1], faults, [])
    [violation] = completed_violations(report)
    assert "never decided" in violation["detail"]
    assert report["outcomes"]["COMPLETED"]["unexplained"] == 1


def test_i1_completed_is_judged_a_run_a_cancel_ended_on_the_spot_cannot_complete():
    snapshot, sink, faults, decisions = history()
    cancel = {"id": 2, "kind": "cancel", "source": "random", "run": RUN, "t": 133.0, "status_after": "CANCELLED"}
    report = run_check(snapshot, sink, faults + [cancel], decisions)
    [violation] = completed_violations(report)
    assert "CANCELLED on the spot" in violation["detail"]
    # a cancel a RUNNING run only noted may come after its last observation point: completing is then allowed
    report = run_check(snapshot, sink, faults + [{**cancel, "status_after": "RUNNING"}], decisions)
    assert report["violations"] == [], report["violations"]
    assert report["outcomes"]["COMPLETED"]["explained"] == 1


def test_i1_a_rejected_policy_approval_does_not_stop_a_run_completing():
    """A policy approval's rejection is a denial the model sees; the run may go on and complete."""
    snapshot, sink, faults, decisions = history()
    snapshot["approvals"].append(
        {
            "id": "a2",
            "run_id": RUN,
            "invocation_id": INV2,
            "kind": "policy",
            "status": "rejected",
            "decided_at": 120.0,
            "attempt": 1,
        }
    )
    decisions.append({"approval": "a2", "run": RUN, "kind": "policy", "decision": "reject", "ok": True, "expect": "ok"})
    report = run_check(snapshot, sink, faults, decisions)
    assert not completed_violations(report), report["violations"]
    assert report["outcomes"]["COMPLETED"]["explained"] == 1


def test_i1_max_attempts_only_when_injected_faults_took_the_lease_more_than_the_limit():
    snapshot, sink, faults, decisions = history()
    snapshot["runs"][0].update(status="FAILED", failure={"reason": "max_attempts_exceeded"})
    assert "I1" in invariants(run_check(snapshot, sink, faults, decisions))
    for k in range(3):
        faults.append(
            {
                "id": 10 + k,
                "kind": "kill",
                "source": "random",
                "t_freeze": 150.0 + k,
                "held": [{"run": RUN, "epoch": 3 + k, "window": "no_effect", "invocation": None, "attempt": None}],
            }
        )
    report = run_check(snapshot, sink, faults, decisions)
    assert not [v for v in report["violations"] if v["invariant"] == "I1" and "max_attempts" in v["detail"]]


@pytest.mark.parametrize("status", ["RUNNING", "QUEUED", "WAITING_FOR_USER"])
def test_i1_a_run_left_unfinished_is_lost(status):
    snapshot, sink, faults, decisions = history()
    snapshot["runs"][0]["status"] = status
    assert "I1" in invariants(run_check(snapshot, sink, faults, decisions))


def test_i1_a_park_counts_only_on_a_fault_caused_approval():
    snapshot, sink, faults, decisions = history()
    snapshot["runs"][0]["status"] = "WAITING_FOR_APPROVAL"
    snapshot["approvals"].append(
        {
            "id": "a2",
            "run_id": RUN,
            "invocation_id": INV,
            "kind": "policy",
            "status": "pending",
            "decided_at": None,
            "attempt": 2,
        }
    )
    assert "I1" in invariants(run_check(snapshot, sink, faults, decisions))
    snapshot["approvals"][-1]["kind"] = "interrupted_side_effect"
    snapshot["approvals"][-1]["attempt"] = 9  # not a park the I8 accounting can place; only I1 is judged here
    report = run_check(snapshot, sink, faults, decisions)
    assert not [v for v in report["violations"] if v["invariant"] == "I1"]
    assert report["outcomes"]["PARKED"]["explained"] == 1


# -- I2: effects by content, ordered against decisions --------------------------------------


def test_i2_a_resend_before_its_approval_is_a_violation_even_if_the_approval_comes_later():
    snapshot, sink, faults, decisions = history()
    snapshot["approvals"][0]["decided_at"] = 135.0  # the re-send arrived at 131
    report = run_check(snapshot, sink, faults, decisions)
    assert invariants(report) == ["I2"]
    assert "after it" in report["violations"][0]["detail"]


def test_i2_a_resend_without_any_decision_is_a_violation():
    snapshot, sink, faults, decisions = history()
    snapshot["approvals"][0]["status"] = "rejected"
    assert "I2" in invariants(run_check(snapshot, sink, faults, decisions))


def test_i2_the_same_effect_under_another_key_is_a_duplicate():
    snapshot, sink, faults, decisions = history()
    inv2 = dict(snapshot["invocations"][0], id=INV2, idempotency_key=KEY2, step_number=2, attempt=1, xid=37)
    snapshot["invocations"].append(inv2)
    sink.append(send(KEY2, 1, 140.0))  # same body, same tool, same run, new key: the approval of i1 does not cover it
    report = run_check(snapshot, sink, faults, decisions)
    assert invariants(report) == ["I2"]
    assert KEY2 in report["violations"][0]["detail"]
    # a different body under the second key is a different effect
    sink[-1] = send(KEY2, 1, 140.0, body={"run": 0, "step": 2, "n": 0})
    assert run_check(snapshot, sink, faults, decisions)["violations"] == []


def test_i2_one_decision_permits_one_resend():
    snapshot, sink, faults, decisions = history()
    sink.append(send(KEY, 2, 132.0))
    report = run_check(snapshot, sink, faults, decisions)
    assert "I2" in invariants(report)


def test_i2_a_lost_effect_is_still_caught():
    snapshot, sink, faults, decisions = history()
    assert invariants(run_check(snapshot, [], faults, decisions)) == ["I2"]


# -- I3: every row against the epoch in force when it was written -------------------------


@pytest.mark.parametrize(
    "table,row",
    [
        (
            "model_calls",
            {"run_id": RUN, "step_number": 1, "attempt_number": 1, "status": "completed", "lease_epoch": 1, "xid": 25},
        ),
        ("checkpoints", {"run_id": RUN, "version": 3, "trigger": "step", "lease_epoch": 2, "xid": 33}),
        (
            "invocations",
            {
                "id": "i9",
                "run_id": RUN,
                "step_number": 1,
                "call_index": 1,
                "tool_name": "echo",
                "read_only": True,
                "status": "completed",
                "effect_sent_at": None,
                "attempt": 1,
                "has_result": True,
                "idempotency_key": "k9",
                "lease_epoch": 1,
                "suspended_kind": None,
                "xid": 22,
            },
        ),
    ],
)
def test_i3_a_zombie_row_at_an_old_epoch_written_after_the_takeover_is_caught(table, row):
    snapshot, sink, faults, decisions = history()
    snapshot[table].append(row)
    report = run_check(snapshot, sink, faults, decisions)
    assert invariants(report) == ["I3"], report["violations"]
    # the same row written before the takeover's transaction is legitimate
    snapshot[table][-1] = dict(
        row, xid=15 if row["lease_epoch"] == 1 else 32, lease_epoch=row["lease_epoch"] if row["lease_epoch"] == 1 else 3
    )
    assert run_check(snapshot, sink, faults, decisions)["violations"] == []


def test_i3_a_zombie_event_in_sequence_order_but_old_epoch_is_caught():
    snapshot, sink, faults, decisions = history()
    # inserted (and numbered) after the takeover committed, at epoch 1: the per-sequence check alone sees it too,
    # the xid check must see it even when no later-epoch event precedes it in the session
    snapshot["events"].insert(3, ev(4, "tool.call.completed", 1, 23))
    for i, e in enumerate(snapshot["events"]):
        e["sequence"] = i + 1
    snapshot["sessions"][0]["event_seq"] = len(snapshot["events"])
    report = run_check(snapshot, sink, faults, decisions)
    assert any(v["invariant"] == "I3" and "transaction 23" in v["detail"] for v in report["violations"]), report[
        "violations"
    ]


def test_i3_a_non_owner_write_is_judged_by_the_events_of_its_transaction():
    snapshot, sink, faults, decisions = history()
    # the operator's approval (transaction 30) sets the invocation back to authorized without touching lease_epoch;
    # it wrote approval.resolved at the run's epoch 2 in the same transaction
    snapshot["invocations"][0].update(lease_epoch=1, xid=30)
    assert run_check(snapshot, sink, faults, decisions)["violations"] == []
    snapshot["invocations"][0]["xid"] = 33  # a transaction with no event: a zombie's
    assert invariants(run_check(snapshot, sink, faults, decisions)) == ["I3"]


def test_i3_without_xids_the_check_says_so():
    snapshot, sink, faults, decisions = history()
    for t in ("events", "invocations", "model_calls", "checkpoints"):
        for row in snapshot[t]:
            row.pop("xid")
    assert run_check(snapshot, sink, faults, decisions)["fencing"] == {"rows_checked": 0, "xid": False}


# -- I8: a fault in the watermark window ends in a recorded decision -------------------------


def _failed_by_takeover(reason):
    snapshot, sink, faults, decisions = history()
    evs = snapshot["events"][:5] + [ev(6, "run.failed", 2, 20, failure={"reason": reason})]
    snapshot["events"] = evs
    snapshot["sessions"][0]["event_seq"] = 6
    snapshot["runs"][0].update(status="FAILED", failure={"reason": reason}, lease_epoch=2)
    snapshot["invocations"][0].update(status="interrupted", has_result=False, lease_epoch=2, xid=20, attempt=1)
    snapshot["model_calls"].pop()
    snapshot["checkpoints"].pop()
    snapshot["approvals"] = []
    return snapshot, sink[:1], faults, []


def test_i8_the_takeover_ending_the_run_instead_of_parking_is_a_violation():
    report = run_check(*_failed_by_takeover("internal_error"))
    assert "I8" in invariants(report) and "I1" in invariants(report)
    assert report["i8"]["equal"] is False
    assert report["i8"]["faults_without_park_explained"] == []
    # even a reason the plan could cause does not excuse abandoning the unknown effect
    report = run_check(*_failed_by_takeover("max_attempts_exceeded"))
    assert "I8" in invariants(report)


def test_i8_a_park_without_its_approval_is_a_violation():
    snapshot, sink, faults, decisions = history()
    snapshot["approvals"][0]["attempt"] = 2  # the approval names another attempt than the one frozen
    report = run_check(snapshot, sink, faults, decisions)
    assert "I8" in invariants(report)
    assert report["i8"]["equal"] is False


def test_i8_a_park_no_takeover_explains_is_a_violation():
    snapshot, sink, faults, decisions = history()
    snapshot["events"][4]["payload"]["invocation"] = "someone-else"  # the takeover did not find i1 in flight
    report = run_check(snapshot, sink, faults, decisions)
    assert "I8" in invariants(report)
    assert report["i8"]["parks_unexplained"] and report["i8"]["faults_without_park_unexplained"]


def test_i8_a_stop_that_closes_the_window_with_its_own_result_is_accounted_for():
    snapshot, sink, faults, decisions = history()
    # no takeover at all: the stopped worker woke up and recorded the result itself
    snapshot["events"] = [e for e in snapshot["events"] if e["sequence"] in (1, 2, 3)] + [ev(4, "run.completed", 1, 13)]
    snapshot["sessions"][0]["event_seq"] = 4
    snapshot["runs"][0]["lease_epoch"] = 1
    snapshot["invocations"][0].update(attempt=1, lease_epoch=1, xid=13)
    snapshot["model_calls"] = snapshot["model_calls"][:1]
    snapshot["model_calls"][0].update(status="completed", xid=12)
    snapshot["checkpoints"] = snapshot["checkpoints"][:1]
    snapshot["approvals"] = []
    faults[0]["kind"] = "stop"
    report = run_check(snapshot, sink[:1], faults, [])
    assert report["violations"] == []
    assert report["i8"]["accounting"]["closed_by_own_result"] == 1 and report["i8"]["equal"] is True
    # the same with no result recorded is not accounted for
    snapshot = copy.deepcopy(snapshot)
    snapshot["invocations"][0].update(has_result=False, status="executing")
    report = run_check(snapshot, sink[:1], faults, [])
    assert "I8" in invariants(report)


def test_i8_an_operator_cancel_before_the_takeover_is_a_recorded_decision():
    snapshot, sink, faults, decisions = _failed_by_takeover("internal_error")
    snapshot["events"][-1] = ev(6, "run.cancelled", 2, 20)
    snapshot["runs"][0].update(status="CANCELLED", failure=None, cancel_requested_at=103.8)
    faults.append({"id": 2, "kind": "cancel", "source": "random", "run": RUN, "t": 103.9})
    report = run_check(snapshot, sink, faults, decisions)
    assert report["violations"] == [], report["violations"]
    assert report["i8"]["accounting"]["decided_otherwise"] == 1
    snapshot["runs"][0]["cancel_requested_at"] = 200.0  # asked after the takeover decided: not the cause
    assert "I8" in invariants(run_check(snapshot, sink, faults, decisions))


# -- the sink's records carry what I2 needs ---------------------------------------------------


def test_the_sink_stamps_arrivals_and_hashes_bodies_by_content(tmp_path):
    import json
    import time
    import urllib.request

    from tests.sink import Sink

    sink = Sink(tmp_path / "sink.jsonl")
    try:
        before = time.time_ns()
        for key, raw in (("k1", b'{"a": 1, "b": [2, 3]}'), ("k2", b'{"b":[2,3],"a":1}'), ("k3", b"not json")):
            req = urllib.request.Request(
                sink.url, data=raw, method="POST", headers={"Idempotency-Key": key, "Content-Type": "application/json"}
            )
            urllib.request.urlopen(req, timeout=10).read()
        after = time.time_ns()
    finally:
        sink.close()
    logged = [json.loads(line) for line in (tmp_path / "sink.jsonl").read_text().splitlines()]
    assert logged == sink.sends and [r["key"] for r in logged] == ["k1", "k2", "k3"]
    assert all(before <= r["t_ns"] <= after for r in logged)
    assert logged[0]["mono_ns"] < logged[1]["mono_ns"] < logged[2]["mono_ns"]
    assert (
        logged[0]["body_sha256"] == logged[1]["body_sha256"] != logged[2]["body_sha256"]
    )  # same content, other key order
    assert logged[2]["body"] == "not json"


def test_i1_an_unhandled_error_in_a_worker_log_is_a_failure_no_fault_caused():
    snapshot, sink, faults, decisions = history()
    snapshot["meta"]["process_logs"] = {
        "qcluster-0": {"tracebacks": 0, "errors": 3, "unhandled_run_errors": 0, "reincarnated": 3}
    }
    assert (
        run_check(snapshot, sink, faults, decisions)["violations"] == []
    )  # reincarnations after SIGKILL are the plan's
    snapshot["meta"]["process_logs"]["qcluster-0"].update(tracebacks=1, unhandled_run_errors=1)
    report = run_check(snapshot, sink, faults, decisions)
    assert invariants(report) == ["I1"] and "qcluster-0" in report["violations"][0]["detail"]


# -- unknown outcomes without a process death (issue 11) ----------------------------------------
# One run, no fault at all: its http_post was sent, the sink closed the connection without an answer, the
# call ended `uncertain` and the executing worker parked the run on an uncertain_side_effect approval; the
# operator approved, the run was re-claimed (epoch 2), re-sent once (attempt 2, same key) and completed.

UAPPROVAL = "u1"


def uncertain_history():
    events = [
        ev(1, "run.created", 0, 10),
        ev(2, "run.claimed", 1, 11, lease_epoch=1),
        ev(3, "tool.call.started", 1, 12),
        ev(
            4,
            "tool.call.failed",
            1,
            13,
            invocation=INV,
            tool="http_post",
            attempt=1,
            outcome="uncertain",
            awaiting_decision=True,
            result=None,
            error={"error": "connection_lost", "uncertain": True},
        ),
        ev(5, "run.waiting_for_approval", 1, 14, kind="uncertain_side_effect"),
        ev(6, "approval.resolved", 1, 30, approval=UAPPROVAL, decision="approved"),
        ev(7, "run.requeued", 1, 30, reason="approval"),
        ev(8, "run.claimed", 2, 31, lease_epoch=2),
        ev(9, "run.completed", 2, 40),
    ]
    snapshot = {
        "runs": [
            {
                "id": RUN,
                "status": "COMPLETED",
                "session_id": SESS,
                "lease_owner": None,
                "lease_epoch": 2,
                "lease_expires_at": None,
                "lease_expirations": 0,
                "attempts": 2,
                "failure": None,
                "cancel_requested_at": None,
                "submitted_at": 100.0,
                "plan": "none",
            }
        ],
        "sessions": [{"id": SESS, "event_seq": 9}],
        "events": events,
        "invocations": [
            {
                "id": INV,
                "run_id": RUN,
                "step_number": 1,
                "call_index": 0,
                "tool_name": "http_post",
                "read_only": False,
                "status": "completed",
                "effect_sent_at": 131.0,
                "attempt": 2,
                "has_result": True,
                "idempotency_key": KEY,
                "lease_epoch": 2,
                "suspended_kind": None,
                "xid": 35,
            }
        ],
        "model_calls": [
            {"run_id": RUN, "step_number": 1, "attempt_number": 1, "status": "completed", "lease_epoch": 1, "xid": 12},
            {"run_id": RUN, "step_number": 2, "attempt_number": 1, "status": "completed", "lease_epoch": 2, "xid": 36},
        ],
        "checkpoints": [
            {"run_id": RUN, "version": 1, "trigger": "step", "lease_epoch": 1, "xid": 12},
            {"run_id": RUN, "version": 2, "trigger": "final", "lease_epoch": 2, "xid": 40},
        ],
        "approvals": [
            {
                "id": UAPPROVAL,
                "run_id": RUN,
                "invocation_id": INV,
                "kind": "uncertain_side_effect",
                "status": "approved",
                "decided_at": 130.0,
                "decided_via": "api",
                "attempt": 1,
                "created_at": 105.0,
            }
        ],
        "meta": {"runs_submitted": 1, "t_first_submit": 100.0, "max_lease_expirations": 3},
    }
    sink = [dict(send(KEY, 1, 103.5), behaviour="close"), send(KEY, 2, 131.0)]
    decisions = [
        {
            "approval": UAPPROVAL,
            "run": RUN,
            "kind": "uncertain_side_effect",
            "decision": "approve",
            "ok": True,
            "expect": "ok",
        }
    ]
    return snapshot, sink, [], decisions


def test_uncertain_a_resend_after_a_prior_approval_passes_and_is_counted():
    report = run_check(*uncertain_history())
    assert report["violations"] == [], report["violations"]
    unc = report["uncertain"]
    assert unc["outcomes"] == 1 and unc["by_tool"] == {"http_post": 1} and unc["by_cause"] == {"connection_lost": 1}
    assert (
        unc["by_window"]["watermark_to_result"] == 1
        and report["faults"]["uncertain_by_window"]["watermark_to_result"] == 1
    )
    assert unc["parked"] == 1 and unc["equal"] is True
    assert unc["sink_faults"] == {"close": 1} and unc["sink_faults_that_ended_uncertain"] == 1
    assert unc["sink_faults_overtaken_by_a_process_fault"] == 0
    assert report["i8"]["equal"] is True and report["i8"]["interrupted_side_effect_approvals"] == 0  # no process died


def test_uncertain_a_resend_without_a_decision_is_a_violation():
    snapshot, sink, faults, decisions = uncertain_history()
    # the run went on as if the answer had come: no park, no approval, and the call was sent again
    snapshot["events"] = snapshot["events"][:4] + [
        ev(5, "run.requeued", 1, 14, reason="resume"),
        ev(6, "run.claimed", 2, 31, lease_epoch=2),
        ev(7, "run.completed", 2, 40),
    ]
    snapshot["sessions"][0]["event_seq"] = 7
    snapshot["approvals"] = []
    report = run_check(snapshot, sink, faults, [])
    assert {"I2", "I8"} <= set(invariants(report)), report["violations"]
    assert any(
        v["invariant"] == "I2" and "no recorded decision permits it" in v["detail"] for v in report["violations"]
    )
    assert report["uncertain"]["equal"] is False and len(report["uncertain"]["unexplained"]) == 1


def test_uncertain_a_resend_under_another_key_without_a_decision_is_a_violation():
    snapshot, sink, faults, decisions = uncertain_history()
    inv2 = dict(snapshot["invocations"][0], id=INV2, idempotency_key=KEY2, step_number=2, attempt=1, xid=37)
    snapshot["invocations"].append(inv2)
    sink.append(
        send(KEY2, 1, 140.0)
    )  # the same effect asked again under a new key: the approval of i1 permits one re-send of i1
    report = run_check(snapshot, sink, faults, decisions)
    assert invariants(report) == ["I2"] and KEY2 in report["violations"][0]["detail"]


def test_uncertain_a_confirm_followed_by_a_resend_is_a_violation():
    snapshot, sink, faults, decisions = uncertain_history()
    snapshot["approvals"][0]["status"] = "confirmed"  # the operator said it took effect: nothing may be sent again
    decisions[0].update(decision="confirm", took_effect=True)
    report = run_check(snapshot, sink, faults, decisions)
    assert invariants(report) == ["I2"], report["violations"]
    assert "no recorded decision permits it" in report["violations"][0]["detail"]
    # the same confirm with no re-send holds every rule, and ends COMPLETED as the plan allows
    snapshot["invocations"][0].update(attempt=1, effect_sent_at=103.0)
    report = run_check(snapshot, sink[:1], faults, decisions)
    assert report["violations"] == [], report["violations"]
    assert report["outcomes"]["COMPLETED"]["explained"] == 1


def test_uncertain_a_confirm_that_it_took_effect_is_not_a_lost_effect():
    snapshot, sink, faults, decisions = uncertain_history()
    snapshot["approvals"][0]["status"] = "confirmed"
    snapshot["invocations"][0].update(attempt=1)
    assert (
        run_check(snapshot, [], faults, decisions)["violations"] == []
    )  # the sink never saw it; the operator vouched for it
    snapshot["approvals"][0]["status"] = "approved"
    assert "I2" in invariants(run_check(snapshot, [], faults, decisions))  # completed by a send nobody received: lost


def test_uncertain_an_approval_decided_after_the_resend_does_not_cover_it():
    snapshot, sink, faults, decisions = uncertain_history()
    snapshot["approvals"][0]["decided_at"] = 132.0  # the re-send arrived at 131
    report = run_check(snapshot, sink, faults, decisions)
    assert invariants(report) == ["I2"] and "after it" in report["violations"][0]["detail"]


def test_uncertain_i1_accepts_a_reject_as_operator_rejected_and_nothing_else():
    snapshot, sink, faults, decisions = uncertain_history()
    snapshot["events"] = snapshot["events"][:5] + [
        ev(6, "approval.resolved", 1, 30, approval=UAPPROVAL, decision="rejected"),
        ev(7, "run.failed", 1, 30, failure={"reason": "operator_rejected"}),
    ]
    snapshot["sessions"][0]["event_seq"] = 7
    snapshot["runs"][0].update(status="FAILED", failure={"reason": "operator_rejected"}, lease_epoch=1)
    snapshot["invocations"][0].update(
        status="uncertain", has_result=False, attempt=1, effect_sent_at=103.0, lease_epoch=1, xid=13
    )
    snapshot["model_calls"].pop()
    snapshot["checkpoints"].pop()
    snapshot["approvals"][0]["status"] = "rejected"
    decisions[0]["decision"] = "reject"
    report = run_check(snapshot, sink[:1], faults, decisions)
    assert report["violations"] == [], report["violations"]
    assert report["outcomes"]["FAILED:operator_rejected"]["explained"] == 1
    # a confirm does not explain operator_rejected, and no decision explains any other failure
    snapshot["approvals"][0]["status"] = "confirmed"
    assert "I1" in invariants(run_check(snapshot, sink[:1], faults, decisions))
    snapshot["approvals"][0]["status"] = "rejected"
    snapshot["runs"][0]["failure"] = {"reason": "internal_error"}
    assert "I1" in invariants(run_check(snapshot, sink[:1], faults, decisions))


def test_uncertain_a_run_parked_on_its_approval_at_the_end_is_explained():
    snapshot, sink, faults, decisions = uncertain_history()
    snapshot["events"] = snapshot["events"][:5]
    snapshot["sessions"][0]["event_seq"] = 5
    snapshot["runs"][0].update(status="WAITING_FOR_APPROVAL", lease_epoch=1)
    snapshot["invocations"][0].update(
        status="uncertain", has_result=False, attempt=1, effect_sent_at=103.0, lease_epoch=1, xid=13
    )
    snapshot["model_calls"].pop()
    snapshot["checkpoints"].pop()
    snapshot["approvals"][0].update(status="pending", decided_at=None)
    report = run_check(snapshot, sink[:1], faults, [])
    assert report["violations"] == [], report["violations"]
    assert report["outcomes"]["PARKED"]["explained"] == 1


def test_uncertain_an_approval_for_an_attempt_that_never_ended_uncertain_is_a_violation():
    snapshot, sink, faults, decisions = uncertain_history()
    snapshot["approvals"][0]["attempt"] = 2
    report = run_check(snapshot, sink, faults, decisions)
    assert "I8" in invariants(report)
    assert report["uncertain"]["parks_unexplained"] and report["uncertain"]["unexplained"]


def test_the_sink_plays_a_chosen_drop_and_records_it(tmp_path):
    import http.client
    import json

    from tests.sink import Sink

    sink = Sink(tmp_path / "sink.jsonl")
    sink.choose = lambda record: "close" if record["key"] == "drop-me" else None
    try:
        answers = {}
        for key in ("drop-me", "keep-me"):
            conn = http.client.HTTPConnection("127.0.0.1", sink.port, timeout=10)
            conn.request(
                "POST",
                "/effect",
                body=b'{"a": 1}',
                headers={"Idempotency-Key": key, "Content-Type": "application/json"},
            )
            try:
                answers[key] = conn.getresponse().status
            except (http.client.RemoteDisconnected, ConnectionError) as exc:
                answers[key] = type(exc).__name__
            conn.close()
    finally:
        sink.close()
    assert answers == {"drop-me": "RemoteDisconnected", "keep-me": 200}
    logged = [json.loads(line) for line in (tmp_path / "sink.jsonl").read_text().splitlines()]
    assert [(r["key"], r.get("behaviour")) for r in logged] == [
        ("drop-me", "close"),
        ("keep-me", None),
    ]  # the request arrived: an effect


# -- the soak without carve-outs (issue 14): database faults, node deaths, web submits ------------


def _tb(t, *exceptions, record="2026-11-30 10:00:00,000 ERROR agentrt.executor run r1: unhandled error"):
    return {"t": t, "record": record, "exceptions": list(exceptions)}


LOST = "django.db.utils.OperationalError: terminating connection due to administrator command"


def test_logs_a_lost_connection_after_a_terminate_of_that_process_backend_is_explained():
    snapshot, sink, faults, decisions = history()
    snapshot["meta"]["process_logs"] = {
        "qcluster-0": {"application_name": "soak-node-0", "traceback_list": [_tb(150.0, LOST)]}
    }
    faults = faults + [
        {
            "id": 2,
            "kind": "terminate",
            "role": "pg_backend",
            "application_name": "soak-node-0",
            "t": 149.5,
            "window": "active",
            "held": [],
        }
    ]
    report = run_check(snapshot, sink, faults, decisions)
    assert report["violations"] == [] and report["logs_judged"]["explained_by_db_fault"] == 1


def test_logs_a_lost_connection_with_no_database_fault_reaching_that_process_is_a_violation():
    snapshot, sink, faults, decisions = history()
    snapshot["meta"]["process_logs"] = {
        "qcluster-0": {"application_name": "soak-node-0", "traceback_list": [_tb(150.0, LOST)]}
    }
    other_node = {
        "id": 2,
        "kind": "terminate",
        "role": "pg_backend",
        "application_name": "soak-node-1",
        "t": 149.5,
        "held": [],
    }
    later = {
        "id": 3,
        "kind": "terminate",
        "role": "pg_backend",
        "application_name": "soak-node-0",
        "t": 151.5,
        "held": [],
    }
    report = run_check(snapshot, sink, faults + [other_node, later], decisions)
    assert invariants(report) == ["I1"] and report["logs_judged"]["unexplained"] == 1


def test_logs_any_other_exception_is_a_violation_even_right_after_the_restart():
    snapshot, sink, faults, decisions = history()
    snapshot["meta"]["process_logs"] = {
        "maintenance": {
            "application_name": "soak-maintenance",
            "traceback_list": [_tb(150.0, "KeyError: 'lease_epoch'"), _tb(150.2, LOST, "ValueError: boom")],
        }
    }
    restart = {"id": 2, "kind": "pg_restart", "role": "postgres_restart", "t": 149.0, "t_ready": 149.6, "held": []}
    report = run_check(snapshot, sink, faults + [restart], decisions)
    assert invariants(report) == ["I1"] and report["logs_judged"]["unexplained"] == 2


def _max_attempts_history(extra_fault: dict | None):
    """A run that lost its lease four times (limit 3): three kills of its worker, and a fourth loss with
    no kill of it — the worker (pid 77, node 0) lost its database connection."""
    events = [ev(1, "run.created", 0, 10)]
    seq, xid = 2, 11
    faults = []
    for epoch in (1, 3, 5, 7):
        events.append(ev(seq, "run.claimed", epoch, xid, lease_epoch=epoch, lease_owner=f"vm:{70 + epoch}:x"))
        events.append(
            ev(
                seq + 1,
                "lease.taken_over",
                epoch + 1,
                xid + 1,
                previous_epoch=epoch,
                lease_epoch=epoch + 1,
                via="sweep",
            )
        )
        events.append(ev(seq + 2, "run.requeued", epoch + 1, xid + 2, reason="resume"))
        if epoch != 7:
            faults.append(
                {
                    "id": len(faults) + 1,
                    "kind": "kill",
                    "role": "busy_worker",
                    "source": "random",
                    "t": 100.0 + seq + 0.5,
                    "t_freeze": 100.0 + seq + 0.5,
                    "pid": 70 + epoch,
                    "node": 0,
                    "held": [{"run": RUN, "epoch": epoch, "window": "no_effect", "invocation": None, "attempt": None}],
                }
            )
        seq, xid = seq + 3, xid + 3
    events[-1] = ev(seq - 1, "run.failed", 8, xid, failure={"reason": "max_attempts_exceeded"})
    snapshot, sink, _, _ = history()
    snapshot["events"] = events
    snapshot["sessions"][0]["event_seq"] = len(events)
    snapshot["runs"][0].update(status="FAILED", lease_epoch=8, failure={"reason": "max_attempts_exceeded"}, plan="none")
    snapshot["invocations"], snapshot["approvals"], snapshot["model_calls"], snapshot["checkpoints"] = [], [], [], []
    snapshot["meta"]["worker_nodes"] = {"77": 0}
    if extra_fault:
        faults.append({"id": len(faults) + 1, "held": [], **extra_fault})
    return snapshot, [], faults, []


def test_i1_max_attempts_counts_a_lease_lost_to_a_terminated_backend_of_its_node():
    claimed_at = 100.0 + 11  # the fourth claim (epoch 7) is event 11
    report = run_check(
        *_max_attempts_history(
            {"kind": "terminate", "role": "pg_backend", "application_name": "soak-node-0", "t": claimed_at + 0.4}
        )
    )
    assert report["violations"] == [], report["violations"]
    assert report["outcomes"]["FAILED:max_attempts_exceeded"]["explained"] == 1


@pytest.mark.parametrize(
    "extra",
    [
        None,  # nothing reached the fourth worker: the runtime lost the lease on its own
        {
            "kind": "terminate",
            "role": "pg_backend",
            "application_name": "soak-node-1",
            "t": 111.4,
        },  # another node's backend
        {"kind": "kill", "role": "pusher", "node": 1, "pid": 5, "t": 111.4},  # another node's pusher
        {"kind": "terminate", "role": "pg_backend", "application_name": "soak-node-0", "t": 109.0},  # before the claim
    ],
)
def test_i1_max_attempts_with_a_lease_loss_no_fault_caused_is_a_violation(extra):
    report = run_check(*_max_attempts_history(extra))
    assert invariants(report) == ["I1"], report["violations"]
    assert "not caused" in report["violations"][0]["detail"]


def test_i1_a_lease_a_worker_took_over_from_its_doorbell_is_tied_to_that_workers_node():
    """The fourth epoch is not a claim but a takeover by a worker's doorbell (`drive_run` found the lease
    expired and resumed the run itself): the epoch is held by that worker (pid 77, node 0), so a fault of
    node 0 explains its loss; read as nobody's, the loss was "not caused" (the long soak's one violation)."""
    claimed_at = 100.0 + 11
    snapshot, sink, faults, decisions = _max_attempts_history(
        {"kind": "kill", "role": "pusher", "node": 0, "pid": 5, "t": claimed_at + 0.4}
    )
    fourth = next(e for e in snapshot["events"] if e["type"] == "run.claimed" and e["payload"]["lease_epoch"] == 7)
    fourth["type"] = "lease.taken_over"
    fourth["payload"] = {**fourth["payload"], "via": "drive_run", "previous_epoch": 6}
    report = run_check(snapshot, sink, faults, decisions)
    assert report["violations"] == [], report["violations"]
    fourth["payload"]["via"] = "api"  # an operator's resume through the API: no worker holds it
    report = run_check(snapshot, sink, faults, decisions)
    assert invariants(report) == ["I1"] and "not caused" in report["violations"][0]["detail"]


def test_i1_a_worker_no_process_table_read_saw_is_tied_to_its_node_by_the_node_log():
    """The fourth worker (pid 77) started and died between two reads of the process table: only
    qcluster-0's log ("... ready for work at 77") says it was node 0's, whose backend was terminated."""
    claimed_at = 100.0 + 11
    snapshot, sink, faults, decisions = _max_attempts_history(
        {"kind": "terminate", "role": "pg_backend", "application_name": "soak-node-0", "t": claimed_at + 0.4}
    )
    snapshot["meta"]["worker_nodes"] = {}
    report = run_check(snapshot, sink, faults, decisions)
    assert invariants(report) == ["I1"] and "'node': None" in report["violations"][0]["detail"]
    snapshot["meta"]["process_logs"] = {
        "qcluster-0": {"application_name": "soak-node-0", "traceback_list": [], "worker_pids": [12, 77]},
        "qcluster-1": {"application_name": "soak-node-1", "traceback_list": [], "worker_pids": [13]},
    }
    report = run_check(snapshot, sink, faults, decisions)
    assert report["violations"] == [], report["violations"]


def test_soak_reads_the_workers_a_node_started_from_its_log():
    from tests.chaos.soak import parse_worker_pids

    lines = [
        "2026-11-30 11:31:30,001 INFO django-q Process-1:1 ready for work at 3946",
        "2026-11-30 11:31:30,002 INFO django-q Process-1:2 ready for work at 3947",
        "2026-11-30 11:31:30,003 INFO django-q Process-1 guarding cluster nebraska",
        "2026-11-30 13:25:38,514 CRITICAL agentrt.qheal cluster winter-one: worker 24716 died (exit code -9); "
        "reincarnated pusher 24720, monitor 24719 and workers [24717, 24718] on new task and result queues",
    ]
    assert parse_worker_pids(lines) == [3946, 3947, 24717, 24718]


SENTINEL_FAILED = "RuntimeError: Q Cluster nebraska failed to start: sentinel exited with code 1"


@pytest.mark.parametrize(
    "tracebacks, faults_added, unexplained",
    [
        ([_tb(149.0, LOST), _tb(150.0, SENTINEL_FAILED)], [149.0], 0),  # the sentinel lost its connection, then died
        ([_tb(150.0, SENTINEL_FAILED)], [140.0], 0),  # a terminate reached the node while it started
        ([_tb(150.0, SENTINEL_FAILED)], [], 1),  # nothing explains the sentinel's death
        ([_tb(150.0, SENTINEL_FAILED)], [100.0], 1),  # a terminate long before the start
        ([_tb(149.0, "ValueError: boom"), _tb(150.0, SENTINEL_FAILED)], [], 2),  # the sentinel's own bug
    ],
)
def test_logs_a_sentinel_that_died_starting_is_explained_only_by_a_fault_that_reached_the_node(
    tracebacks, faults_added, unexplained
):
    snapshot, sink, faults, decisions = history()
    snapshot["meta"]["process_logs"] = {"qcluster-0": {"application_name": "soak-node-0", "traceback_list": tracebacks}}
    added = [
        {"id": 10 + i, "kind": "terminate", "role": "pg_backend", "application_name": "soak-node-0", "t": t, "held": []}
        for i, t in enumerate(faults_added)
    ]
    report = run_check(snapshot, sink, faults + added, decisions)
    assert report["logs_judged"]["unexplained"] == unexplained, report["violations"]
    assert invariants(report) == (["I1"] if unexplained else [])


def test_i6_a_cancel_that_cut_a_live_request_must_record_it_uncertain():
    snapshot, sink, faults, decisions = history()
    snapshot["runs"][0].update(status="CANCELLED")
    snapshot["invocations"][0].update(status="uncertain", has_result=False, attempt=1)
    faults = faults + [{"id": 2, "kind": "cancel", "run": RUN, "t": 104.0}]
    snapshot["approvals"], decisions, sink = [], [], [send(KEY, 1, 110.0)]
    snapshot["events"] = snapshot["events"][:3] + [
        ev(
            4,
            "tool.call.failed",
            1,
            20,
            invocation=INV,
            attempt=1,
            outcome="uncertain",
            tool="http_post",
            error={"error": "cancelled"},
        ),
        ev(5, "run.cancelled", 1, 21),
    ]
    snapshot["sessions"][0]["event_seq"] = 5
    snapshot["runs"][0]["lease_epoch"] = 1
    snapshot["checkpoints"] = snapshot["checkpoints"][:1]
    snapshot["model_calls"] = snapshot["model_calls"][:1]
    assert "I6" not in invariants(run_check(snapshot, sink, faults, decisions))
    snapshot["events"][3]["payload"]["outcome"] = "failed"  # not recorded as unknown: the cancel abandoned it
    assert "I6" in invariants(run_check(snapshot, sink, faults, decisions))


def test_i1_a_refused_submit_is_a_lost_run():
    snapshot, sink, faults, decisions = history()
    snapshot["meta"]["submit_errors"] = [{"index": 4, "error": {"code": "idempotency_key_reused"}}]
    assert invariants(run_check(snapshot, sink, faults, decisions)) == ["I1"]


def test_deaths_are_counted_by_process_type_and_window_and_only_workers_fill_the_run_windows():
    snapshot, sink, faults, decisions = history()
    more = [
        {"kind": "kill", "role": "idle_worker", "window": "idle", "held": [], "t": 120.0, "pid": 9, "node": 0},
        {"kind": "kill", "role": "sentinel", "window": "watermark_to_result", "held": [], "t": 121.0, "node": 0},
        {"kind": "kill", "role": "web_node", "window": "submit_in_flight", "held": [], "t": 122.0, "node": 1},
        {
            "kind": "terminate",
            "role": "pg_backend",
            "window": "idle in transaction",
            "held": [],
            "t": 123.0,
            "application_name": "soak-node-0",
        },
        {
            "kind": "pg_restart",
            "role": "postgres_restart",
            "window": "no_effect",
            "held": [],
            "t": 124.0,
            "t_ready": 125.0,
        },
        {
            "kind": "stop",
            "role": "busy_worker",
            "window": "no_effect",
            "t": 126.0,
            "t_freeze": 126.0,
            "held": [{"run": "gone", "epoch": 9, "window": "no_effect", "invocation": None, "attempt": None}],
        },
    ]
    report = run_check(snapshot, sink, faults + [{"id": i + 2, **f} for i, f in enumerate(more)], decisions)
    d = report["deaths"]
    assert (
        d["total"] == 6 and d["sigkill"] == 4 and d["pg_backends_terminated"] == 1 and d["pg_restarts"] == 1
    )  # a stop is no death
    assert d["by_type_window"]["sentinel"] == {"watermark_to_result": 1}
    assert d["by_type_window"]["web_node"] == {"submit_in_flight": 1}
    assert d["by_type"]["busy_worker"] == 1 and d["by_type"]["monitor"] == 0 and d["types_hit"]["monitor"] is False
    # the sentinel's death is not a kill of a worker in the watermark window
    assert (
        report["faults"]["kill_by_window"]["watermark_to_result"] == 1
        and report["faults"]["kill_by_window"]["idle"] == 1
    )


def _resumer_died_history(decision: str = "run.waiting_for_approval"):
    """The takeover (epoch 2) marks the call interrupted and its resumer dies before deciding; the next
    takeover (epoch 3, from the resumer's epoch) finds nothing new in flight and makes the decision."""
    snapshot, sink, faults, decisions = history()
    events = snapshot["events"][:5] + [
        ev(6, "lease.taken_over", 3, 25, previous_epoch=2, lease_epoch=3, via="sweep"),
        ev(7, decision, 3, 26, kind="interrupted_side_effect"),
        ev(8, "approval.resolved", 3, 30, approval=APPROVAL),
        ev(9, "run.requeued", 3, 30, reason="approval"),
        ev(10, "run.claimed", 4, 31, lease_epoch=4),
        ev(11, "run.completed", 4, 40),
    ]
    snapshot["events"] = events
    snapshot["sessions"][0]["event_seq"] = 11
    snapshot["runs"][0]["lease_epoch"] = 4
    snapshot["invocations"][0]["lease_epoch"] = 4
    snapshot["checkpoints"][1]["lease_epoch"] = 4
    snapshot["model_calls"][1]["lease_epoch"] = 4
    return snapshot, sink, faults, decisions


def test_i8_a_resumer_that_died_before_deciding_hands_the_unknown_effect_to_the_next_takeover():
    report = run_check(*_resumer_died_history())
    assert report["violations"] == [], report["violations"]
    assert report["i8"]["matched"] == 1 and report["i8"]["equal"] is True


def test_i8_the_next_takeover_continuing_past_the_inherited_unknown_effect_is_a_violation():
    assert "I8" in invariants(run_check(*_resumer_died_history("run.requeued")))
