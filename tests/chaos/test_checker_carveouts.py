"""The checker's rules for what issue 33 item 6 added to the soak, each fed a
synthetic history that respects it (and must pass) and one that breaks it
(and must be caught): runs whose tool reconciles its own calls, stops of
whole nodes, the Redis and sink restarts, tracebacks of processes killed
while they start, and the counts that show each new fault kind landed.

The histories are test_checker.py's: one run killed between the watermark
and the result of its only side effect, taken over (epoch 1 -> 2) and parked;
and one whose live call ended `uncertain` (no process died)."""

from __future__ import annotations

import io
import json
import lzma
import tarfile

import pytest

from tests.chaos.checker import check, parse_jsonl
from tests.chaos.plans import RECONCILED_TOOL, rule
from tests.chaos.test_checker import INV, KEY, RUN, UAPPROVAL, ev, history, send, uncertain_history


def invariants(report):
    return sorted({v["invariant"] for v in report["violations"]})


def answer(t_read, answer, seen=(), attempt=1, key=KEY):
    return {
        "t_read": t_read,
        "t": t_read + 0.001,
        "pid": 7,
        "run": RUN,
        "invocation": INV,
        "attempt": attempt,
        "status": "interrupted",
        "key": key,
        "seen": list(seen),
        "answer": answer,
    }


def reconciled(snapshot, share=0.0):
    snapshot["invocations"][0]["tool_name"] = RECONCILED_TOOL
    snapshot["meta"].update(reconciled_tools=[RECONCILED_TOOL], reconcile_rule={"seed": "7", "conflict_share": share})
    return snapshot


# -- runs whose tool reconciles its own calls -----------------------------------------------------


def reconciled_history():
    """history(), but the call's tool has a reconciler: the takeover asked it (the sink had nothing, so it
    answered `waiting`) and parked the run on a `reconcile` approval, which the operator approved."""
    snapshot, sink, faults, decisions = history()
    reconciled(snapshot)
    snapshot["approvals"][0]["kind"] = "reconcile"
    decisions[0]["kind"] = "reconcile"
    # the takeover is event 4 (t=104), its park event 6 (t=106); the sink logged attempt 1 only at 110
    return snapshot, sink[:1] + [send(KEY, 2, 131.0)], faults, decisions, [answer(104.5, "waiting")]


def test_reconciled_a_park_the_reconciler_asked_for_passes_and_is_counted():
    report = check(*reconciled_history())
    assert report["violations"] == [], report["violations"]
    rc = report["reconcilers"]
    assert rc["runs"] == 1 and rc["answers"] == 1 and rc["followed"] == 1 and rc["not_followed"] == []
    assert rc["decisions_by_answer"] == {"waiting": 1} and rc["decisions_by_kind"] == {"takeover": 1}
    assert report["i8"]["matched"] == 1 and report["i8"]["equal"] is True  # parked on the reconcile approval


def test_reconciled_a_decision_other_than_the_answer_is_a_violation():
    snapshot, sink, faults, decisions, answers = reconciled_history()
    answers[0].update(answer="continue", seen=["1"])  # the sink holds it: the run must go on, not wait
    sink[0]["t_ns"] = int(102.0 * 1e9)
    report = check(snapshot, sink, faults, decisions, answers)
    assert "I8" in invariants(report)
    assert len(report["reconcilers"]["not_followed"]) == 1
    assert "calls for run.requeued" in report["reconcilers"]["not_followed"][0]["why"]
    assert report["i8"]["faults_without_park_unexplained"]


def test_reconciled_a_decision_nobody_asked_the_reconciler_for_is_a_violation():
    snapshot, sink, faults, decisions, _ = reconciled_history()
    report = check(snapshot, sink, faults, decisions, [])
    assert "I8" in invariants(report)
    assert "without an answer of its tool's reconciler" in report["reconcilers"]["not_followed"][0]["why"]
    # an answer given before the takeover, or after the decision, is not the one asked
    for t in (103.0, 107.0):
        report = check(snapshot, sink, faults, decisions, [answer(t, "waiting")])
        assert "I8" in invariants(report)


def test_reconciled_an_answer_against_its_rule_or_the_sink_is_a_violation():
    snapshot, sink, faults, decisions, answers = reconciled_history()
    # it saw nothing and answered `continue`: its rule gives `waiting`
    report = check(snapshot, sink, faults, decisions, [answer(104.5, "continue")])
    assert "answered continue where its rule gives waiting" in report["reconcilers"]["answers_wrong"][0]["problems"][0]
    # it missed a POST the sink had logged well before it read
    sink[0]["t_ns"] = int(101.0 * 1e9)
    report = check(snapshot, sink, faults, decisions, answers)
    assert "did not see attempt(s) ['1']" in report["reconcilers"]["answers_wrong"][0]["problems"][0]
    # it saw a POST the sink never logged
    report = check(snapshot, sink[1:], faults, decisions, [answer(104.5, "continue", seen=["1"])])
    assert any("the sink had not logged" in p for p in report["reconcilers"]["answers_wrong"][0]["problems"])
    assert "I8" in invariants(report)


def test_reconciled_conflict_explains_reconcile_conflict_and_nothing_else_does():
    snapshot, sink, faults, decisions, _ = reconciled_history()
    snapshot["events"] = snapshot["events"][:5] + [ev(6, "run.failed", 2, 21, failure={"reason": "reconcile_conflict"})]
    snapshot["sessions"][0]["event_seq"] = 6
    snapshot["runs"][0].update(status="FAILED", failure={"reason": "reconcile_conflict"}, lease_epoch=2)
    snapshot["invocations"][0].update(status="interrupted", has_result=False, lease_epoch=2, xid=20, attempt=1)
    snapshot["model_calls"].pop()
    snapshot["checkpoints"].pop()
    snapshot["approvals"] = []
    reconciled(snapshot, share=1.0)  # every key conflicts
    assert rule("7", KEY, 1.0, []) == "conflict"
    report = check(snapshot, [], faults, [], [answer(104.5, "conflict")])
    assert report["violations"] == [], report["violations"]
    assert report["outcomes"]["FAILED:reconcile_conflict"]["explained"] == 1
    assert report["i8"]["accounting"]["decided_otherwise"] == 1
    # without the reconciler's conflict the same failure is unexplained
    reconciled(snapshot, share=0.0)
    report = check(snapshot, [], faults, [], [answer(104.5, "waiting")])
    assert "I1" in invariants(report) and "I8" in invariants(report)
    assert report["outcomes"]["FAILED:reconcile_conflict"]["unexplained"] == 1


def test_reconciled_a_cancel_requested_before_the_decision_ends_the_run_as_for_an_operator_question():
    snapshot, sink, faults, decisions, _ = reconciled_history()
    snapshot["events"] = snapshot["events"][:5] + [ev(6, "run.cancelled", 2, 21)]
    snapshot["sessions"][0]["event_seq"] = 6
    snapshot["runs"][0].update(status="CANCELLED", lease_epoch=2, cancel_requested_at=103.8)
    snapshot["invocations"][0].update(status="interrupted", has_result=False, lease_epoch=2, xid=20, attempt=1)
    snapshot["model_calls"].pop()
    snapshot["checkpoints"].pop()
    snapshot["approvals"] = []
    faults.append({"id": 2, "kind": "cancel", "source": "random", "run": RUN, "t": 103.9})
    report = check(snapshot, [], faults, [], [])
    assert report["violations"] == [], report["violations"]
    assert report["reconcilers"]["decisions_by_answer"] == {"none (cancelled first)": 1}
    snapshot["runs"][0]["cancel_requested_at"] = 200.0  # asked after the decision: the reconciler was owed
    assert "I8" in invariants(check(snapshot, [], faults, [], []))


def reconciled_uncertain():
    """uncertain_history(), but the call's tool has a reconciler: the live worker asked it, the sink held the
    POST (dropped its answer), so it answered `continue` and the run went on without a re-send."""
    snapshot, sink, faults, _ = uncertain_history()
    reconciled(snapshot)
    snapshot["events"] = snapshot["events"][:4] + [
        ev(5, "run.requeued", 1, 14, reason="resume"),
        ev(6, "run.claimed", 2, 31, lease_epoch=2),
        ev(7, "run.completed", 2, 40),
    ]
    snapshot["sessions"][0]["event_seq"] = 7
    snapshot["invocations"][0].update(status="uncertain", has_result=True, attempt=1, effect_sent_at=103.0)
    snapshot["approvals"] = []
    entry = dict(answer(104.5, "continue", seen=["1"]), status="uncertain")
    return snapshot, sink[:1], faults, [], [entry]


def test_reconciled_uncertain_continue_is_explained_and_a_resend_is_not():
    report = check(*reconciled_uncertain())
    assert report["violations"] == [], report["violations"]
    assert report["uncertain"]["equal"] is True and len(report["uncertain"]["explained_otherwise"]) == 1
    assert report["reconcilers"]["decisions_by_kind"] == {"uncertain": 1}
    snapshot, sink, faults, decisions, answers = reconciled_uncertain()
    report = check(snapshot, sink + [send(KEY, 2, 131.0)], faults, decisions, answers)
    assert invariants(report) == ["I2"]  # `continue` permits no re-send


def test_reconciled_uncertain_waiting_parks_on_a_reconcile_approval():
    snapshot, sink, faults, decisions, answers = reconciled_uncertain()
    snapshot["events"] = snapshot["events"][:4] + [ev(5, "run.waiting_for_approval", 1, 14, kind="reconcile")]
    snapshot["sessions"][0]["event_seq"] = 5
    snapshot["runs"][0].update(status="WAITING_FOR_APPROVAL", lease_epoch=1)
    snapshot["invocations"][0].update(has_result=False, lease_epoch=1, xid=13)
    snapshot["model_calls"].pop()
    snapshot["checkpoints"].pop()
    snapshot["approvals"] = [
        {
            "id": UAPPROVAL,
            "run_id": RUN,
            "invocation_id": INV,
            "kind": "reconcile",
            "status": "pending",
            "decided_at": None,
            "decided_via": None,
            "attempt": 1,
            "created_at": 105.0,
        }
    ]
    answers[0].update(answer="waiting", seen=[])
    sink[0]["t_ns"] = int(104.8 * 1e9)  # logged after the reconciler read (within the slack): not missed
    report = check(snapshot, sink, faults, decisions, answers)
    assert report["violations"] == [], report["violations"]
    assert report["uncertain"]["parked_by_reconciler"] == 1
    assert report["i8"]["parks_unexplained"] == []  # the live call's reconcile park is not a takeover's
    snapshot["approvals"][0]["attempt"] = 2  # a reconcile approval of another attempt
    assert "I8" in invariants(check(snapshot, sink, faults, decisions, answers))


def test_reconciled_a_takeover_that_was_fenced_hands_the_decision_to_its_successor():
    snapshot, sink, faults, decisions, answers = reconciled_history()
    # the first resumer (epoch 2) lost its lease while its reconciler thought; epoch 3 took over and parked
    evs = snapshot["events"]
    snapshot["events"] = evs[:5] + [
        ev(6, "run.fenced", 2, 21, lease_owner="m:1:x", lease_epoch=2),
        ev(7, "lease.taken_over", 3, 22, previous_epoch=2, lease_epoch=3, via="sweep"),
        {**evs[5], "sequence": 8, "lease_epoch": 3, "xid": 23, "occurred_at": 108.0},
        *[{**e, "sequence": e["sequence"] + 2, "occurred_at": e["occurred_at"] + 2} for e in evs[6:]],
    ]
    for e in snapshot["events"][8:]:
        e["lease_epoch"] = max(e["lease_epoch"], 3)
    snapshot["events"][9]["lease_epoch"] = 4
    snapshot["events"][9]["payload"]["lease_epoch"] = 4
    snapshot["events"][10]["lease_epoch"] = 4
    snapshot["runs"][0]["lease_epoch"] = 4
    snapshot["sessions"][0]["event_seq"] = 12
    snapshot["invocations"][0]["lease_epoch"] = 4
    snapshot["model_calls"][1]["lease_epoch"] = 4
    snapshot["checkpoints"][1]["lease_epoch"] = 4
    report = check(snapshot, sink, faults, decisions, answers + [answer(107.5, "waiting")])
    assert report["reconcilers"]["not_followed"] == [], report["reconcilers"]
    assert report["reconcilers"]["decisions"] == 1  # the decider's, once
    assert not [v for v in report["violations"] if v["invariant"] == "I8"], report["violations"]


# -- a whole node stopped -------------------------------------------------------------------------


def _max_attempts_by_node_stop(pids):
    snapshot, sink, faults, decisions = history()
    snapshot["runs"][0].update(status="FAILED", failure={"reason": "max_attempts_exceeded"}, lease_epoch=2)
    snapshot["meta"]["max_lease_expirations"] = 0  # one loss is past the limit
    snapshot["events"] = [
        ev(1, "run.created", 0, 10),
        ev(2, "run.claimed", 1, 11, lease_epoch=1, lease_owner="h:4242:n"),
        ev(3, "lease.taken_over", 2, 20, previous_epoch=1, lease_epoch=2, via="sweep"),
        ev(4, "run.failed", 2, 21, failure={"reason": "max_attempts_exceeded"}),
    ]
    snapshot["sessions"][0]["event_seq"] = 4
    snapshot["invocations"], snapshot["model_calls"], snapshot["checkpoints"], snapshot["approvals"] = [], [], [], []
    snapshot["meta"]["worker_nodes"] = {"4242": 0}
    # the node was frozen while its worker was in the middle of the claim: nothing held when classified
    stop = {"id": 1, "kind": "stop", "role": "node", "node": 0, "pids": pids, "held": [], "t_freeze": 102.5}
    stop.update(t=102.5, t_cont=105.0, source="random")
    return snapshot, [], [stop], []


def test_a_lease_lost_while_its_whole_node_was_stopped_is_caused_by_the_stop():
    report = check(*_max_attempts_by_node_stop([4240, 4241, 4242]))
    assert report["violations"] == [], report["violations"]
    assert report["outcomes"]["FAILED:max_attempts_exceeded"]["why"] == {
        "1 lease losses, each caused by an injected fault (limit 0)": 1
    }
    assert report["coverage"]["stops_by_target"] == {"busy_worker": 0, "idle_worker": 0, "node": 1}
    report = check(*_max_attempts_by_node_stop([4240, 4241]))  # another node's processes
    assert "I1" in invariants(report)


# -- tracebacks of processes the soak's faults reached -------------------------------------------


def _logs(tb, name="web-0", app="soak-web-0"):
    return {name: {"application_name": app, "traceback_list": [tb]}}


def test_logs_a_lost_redis_connection_is_explained_by_the_redis_restart_only():
    snapshot, sink, faults, decisions = history()
    tb = {
        "t": 201.0,
        "t_next": 201.2,
        "record": "2026-11-30 10:00:00,000 ERROR django.request Internal Server Error: /api/runs/",
        "exceptions": [
            "ConnectionRefusedError: [Errno 111] Connection refused",
            "redis.exceptions.ConnectionError: Error 111 connecting to 127.0.0.1:6390. Connection refused.",
        ],
    }
    snapshot["meta"]["process_logs"] = _logs(tb)
    redis = {"id": 9, "kind": "redis_restart", "role": "redis_restart", "t": 200.5, "t_ready": 200.6, "held": []}
    report = check(snapshot, sink, faults + [redis], decisions)
    assert report["violations"] == [], report["violations"]
    assert report["logs_judged"]["by_process"]["web-0"]["causes"] == {"the Redis restart": 1}
    assert report["deaths"]["redis_restarts"] == 1
    assert "I1" in invariants(check(snapshot, sink, faults, decisions))  # no restart: unexplained
    redis.update(t=500.0, t_ready=500.1)  # long after
    assert "I1" in invariants(check(snapshot, sink, faults + [redis], decisions))


def test_logs_a_child_traceback_is_placed_between_the_records_around_it():
    snapshot, sink, faults, decisions = history()
    # printed by a sentinel starting: the record before it is older than the restart, the next one younger
    tb = {
        "t": 199.0,
        "t_next": 203.0,
        "record": "2026-11-30 10:00:00,000 CRITICAL agentrt.qheal the qcluster main process is gone; stopping",
        "exceptions": [
            "django.db.utils.OperationalError: connection failed: FATAL:  the database system is starting up"
        ],
    }
    snapshot["meta"]["process_logs"] = _logs(tb, "qcluster-0", "soak-node-0")
    restart = {"id": 9, "kind": "pg_restart", "role": "postgres_restart", "t": 201.0, "t_ready": 202.0, "held": []}
    assert check(snapshot, sink, faults + [restart], decisions)["violations"] == []
    tb["t_next"] = None  # without the upper bound it is placed before the restart
    assert "I1" in invariants(check(snapshot, sink, faults + [restart], decisions))


def test_logs_a_node_whose_sentinel_was_killed_while_it_started_is_explained_by_that_kill():
    snapshot, sink, faults, decisions = history()
    failed = "RuntimeError: Q Cluster nebraska failed to start: sentinel exited with code -9"
    snapshot["meta"]["process_logs"] = _logs({"t": 300.0, "record": "x", "exceptions": [failed]}, "qcluster-1", "n1")
    kill = {"id": 9, "kind": "kill", "role": "sentinel", "node": 1, "supervised": "qcluster-1", "t": 299.0}
    report = check(snapshot, sink, faults + [kill], decisions)
    assert report["violations"] == [], report["violations"]
    assert "SIGKILL of the node's sentinel" in next(iter(report["logs_judged"]["by_process"]["qcluster-1"]["causes"]))
    kill["node"], kill["supervised"] = 0, "qcluster-0"  # another node's sentinel
    assert "I1" in invariants(check(snapshot, sink, faults + [kill], decisions))


# -- the sink restarted with a POST in flight -----------------------------------------------------


def test_sink_restart_counts_the_post_it_cut_and_how_it_ended():
    snapshot, sink, faults, decisions = uncertain_history()
    snapshot["events"][3]["occurred_at"] = 104.2  # the reset reached the worker after the kill
    sink[0] = dict(send(KEY, 1, 103.5), behaviour="delay:3600", held_for_restart=True)
    restart = {"id": 5, "kind": "sink_restart", "t": 104.0, "t_ready": 104.1, "at": "t", "held_post": {"key": KEY}}
    report = check(snapshot, sink, faults + [restart], decisions)
    assert report["violations"] == [], report["violations"]
    sr = report["sink_restarts"]
    assert sr["restarts"] == 1 and sr["in_flight"] == 1 and sr["resets_ended_uncertain"] == 1
    assert sr["by_restart"][0]["cut"][0]["ended"] == "uncertain (connection_lost)"
    assert report["uncertain"]["sink_faults"] == {"held_for_restart": 1}
    assert report["deaths"]["total"] == 0  # the sink is not a process of the deployment
    # a POST answered before the kill was not in flight
    sink[0] = send(KEY, 1, 103.5)
    assert check(snapshot, sink, faults + [restart], decisions)["sink_restarts"]["in_flight"] == 0


def test_kills_of_young_processes_stops_by_target_and_the_drain_are_counted():
    snapshot, sink, faults, decisions = history()
    snapshot["meta"]["t_drain"] = 150.0
    more = [
        {"id": 2, "kind": "kill", "role": "sentinel", "node": 0, "uptime": 3.0, "t": 120.0, "held": []},
        {"id": 3, "kind": "kill", "role": "run_maintenance", "uptime": 45.0, "t": 151.0, "held": []},
        {"id": 4, "kind": "stop", "role": "idle_worker", "held": [], "t_freeze": 152.0, "t": 152.0, "t_cont": 154.0},
    ]
    report = check(snapshot, sink, faults + more, decisions)
    cov = report["coverage"]
    assert cov["kills_young_by_type"] == {"sentinel": 1} and cov["kills_with_uptime"] == 2
    assert cov["stops_by_target"] == {"busy_worker": 0, "idle_worker": 1, "node": 0}
    assert cov["drain"]["deaths"] == 1 and cov["drain"]["stops"] == 1


def test_a_run_that_ended_with_a_side_effect_still_executing_abandoned_it():
    snapshot, sink, faults, decisions = history()
    # the worker lost its connection in the next call's watermark and the run was failed internal_error: the
    # first call had been sent (the sink holds it), its result never written, nobody asked
    snapshot["events"] = snapshot["events"][:3] + [ev(4, "run.failed", 1, 13, failure={"reason": "internal_error"})]
    snapshot["sessions"][0]["event_seq"] = 4
    snapshot["runs"][0].update(status="FAILED", failure={"reason": "internal_error"}, lease_epoch=1)
    snapshot["invocations"][0].update(status="executing", has_result=False, attempt=1, lease_epoch=1, xid=12)
    snapshot["model_calls"], snapshot["checkpoints"], snapshot["approvals"] = snapshot["model_calls"][:1], [], []
    snapshot["model_calls"][0].update(status="completed", xid=11)
    report = check(snapshot, sink[:1], [], [])
    assert invariants(report) == ["I1", "I6"], report["violations"]
    assert "still executing" in next(v["detail"] for v in report["violations"] if v["invariant"] == "I6")
    snapshot["invocations"][0]["status"] = "interrupted"  # labelled unknown: not abandoned (I1 still says why not)
    assert invariants(check(snapshot, sink[:1], [], [])) == ["I1"]


def test_an_operator_decision_refused_for_a_reason_nobody_expected_is_a_violation():
    snapshot, sink, faults, decisions = history()
    refused = {"approval": "a9", "run": RUN, "kind": "reconcile", "decision": "approve", "expect": "ok", "ok": False}
    report = check(snapshot, sink, faults, decisions + [dict(refused, error="approval_error")])
    assert invariants(report) == ["I7"], report["violations"]
    # refused as the product says it must be (the run cannot go on), or lost with the database and tried again
    for entry in (dict(refused, expect="refused", error="run_cancel_requested"), dict(refused, expect="retried")):
        assert check(snapshot, sink, faults, decisions + [entry])["violations"] == []


# -- artifacts -------------------------------------------------------------------------------------


def test_a_line_cut_short_by_a_kill_is_skipped_not_fatal():
    text = '{"key": "a", "attempt": "1"}\n{"key": "b", "att\n{"key": "c", "attempt": "1"}\n'
    assert [r["key"] for r in parse_jsonl(text)] == ["a", "c"]


def test_the_bundle_rederives_the_report_of_the_full_artifacts(tmp_path):
    from tests.chaos.bundle import SLIM_KEYS, pack, unpack
    from tests.chaos.report import from_bundle, rerender

    snapshot, sink, faults, decisions, answers = reconciled_history()
    snapshot["events"][4]["payload"]["big"] = "x" * 10000  # what the checker never reads is not kept
    art = tmp_path / "art"
    art.mkdir()
    (art / "snapshot.json").write_text(json.dumps(snapshot))
    for name, rows in (("sink", sink), ("faults", faults), ("decisions", decisions), ("reconcile", answers)):
        (art / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config: dict = {"runs": 1, "seed": 7, "workers": 1, "clusters": 1, "lease_seconds": 2.0, "max_inflight": 1}
    config.update(wall_s=1.0, kill_every=None, stop_every=None, cancel_rate=0, approve_rate=1, no_faults=False)
    config.update(planned_fraction=1, artifacts=str(art))
    (art / "report.json").write_text(json.dumps({"config": config, "planned": {}}))
    info = pack(art, tmp_path / "b.tar.xz")
    assert info["bytes"] < 4000, info
    full, md_full = rerender(art)
    again, md = from_bundle(tmp_path / "b.tar.xz")
    assert md.replace(f"- {again['config']['bundle']}\n", "") == md_full
    unpacked = unpack(tmp_path / "b.tar.xz", tmp_path / "x")
    slim = json.loads((unpacked / "snapshot.json").read_text())
    assert "big" not in slim["events"][4]["payload"] and set(slim["events"][4]["payload"]) <= SLIM_KEYS
    assert len(slim["events"]) == len(snapshot["events"])
    # a bundle that carries anything else is refused
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"#!/bin/sh\n"
        info_ = tarfile.TarInfo("../evil.sh")
        info_.size = len(data)
        tar.addfile(info_, io.BytesIO(data))
    (tmp_path / "evil.tar.xz").write_bytes(lzma.compress(buf.getvalue()))
    with pytest.raises(SystemExit):
        unpack(tmp_path / "evil.tar.xz", tmp_path / "y")
