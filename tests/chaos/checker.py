"""The chaos soak's oracle: a pure function over a database snapshot, the
effect sink's log and the fault log (RELIABILITY §2, invariants I1–I8).

Nothing here touches Django, the database or the clock: `check(...)` takes
plain dicts and lists (as `soak.py` dumps them to JSON) and returns a report,
so a soak's artifacts can be re-checked offline:

    python -m tests.chaos.checker ARTIFACT_DIR   # snapshot.json and the *.jsonl logs (ARTIFACTS)

Inputs
------
snapshot: {"runs", "sessions", "events", "invocations", "model_calls",
           "checkpoints", "approvals", "meta"} — rows as dicts, UUIDs as
           strings, timestamps as POSIX seconds (floats). Rows of events,
           invocations, model_calls and checkpoints carry `xid` (PostgreSQL
           xmin: the transaction that wrote the row's current version).
           meta may say `reconciler` (a global reconciler was configured),
           `reconciled_tools` and `reconcile_rule` (tools with a reconciler
           of their own, and the rule it answers by), `t_drain` (the last
           submit) and `max_lease_expirations`.
sink:     one dict per POST the sink received, in arrival order:
           {"key": Idempotency-Key, "attempt": X-Agentrt-Attempt, "path",
           "body", "body_sha256", "t_ns": CLOCK_REALTIME ns, "mono_ns":
           CLOCK_MONOTONIC ns} (tests/sink.py).
faults:   one dict per fault the soak injected (`kind` kill | stop |
           terminate | pg_restart | redis_restart | sink_restart; others such
           as `cancel` or `aborted` are context). A kill/stop names the runs
           the worker (or, a node stop, each worker of the node) held when it
           was frozen, each with the window the database showed at that
           moment: {"run", "epoch", "window", "invocation", "attempt"}.
decisions: the soak's operator log: one dict per approval_decide call
           {"approval", "run", "decision", "ok", "expect": "ok"|"refused"}.
reconciles: the tools' reconcilers' log (tests/chaos/tools.py): one dict per
           answer {"run", "invocation", "attempt", "key", "t_read", "seen",
           "answer"}.

Windows (of the in-flight side-effect call of the run the worker held):
`before_watermark` (an authorized side-effect invocation whose watermark is
not committed), `watermark_to_result` (status `executing`: watermark
committed, no result), `after_result` (the run's latest side-effect result is
committed and no other one is in flight), `no_effect` (no side-effect call
yet: model or read-only phases), `idle` (the worker held no lease).

What is judged (beyond "is every run terminal"): I1 every end against what
the run's plan and the recorded faults and decisions allow
(`_judge_outcomes`); I2 deliveries by content, ordered against the
decisions that permit a re-send (`_check_effects`, clock domains there); I3
every row against the epoch in force at its transaction
(`_check_rows_against_epochs`); I8 every fault in the watermark window
ends in a recorded decision and every park comes from a takeover ("equal"
is that accounting, checked); for a tool with its own reconciler, each
answer against its rule and the sink, and each decision against the answer
(`_judge_reconciled`). Counted, so that a kind of fault no run met shows:
stops by what they froze, kills of young processes, the drain's faults
(`_coverage`), and what each sink restart cut (`_sink_restarts`).
"""

from __future__ import annotations

import bisect
import json
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

WINDOWS = ("before_watermark", "watermark_to_result", "after_result")
ALL_WINDOWS = WINDOWS + ("no_effect", "idle")
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED"}
PARKED = {"WAITING_FOR_APPROVAL", "WAITING_FOR_USER"}
# approvals whose `approved` permits one re-send of the call (issue 11): a process died in the watermark window
# (interrupted), a live call's answer never came (uncertain), or the reconciler paused it
RERUN_KINDS = {"interrupted_side_effect", "uncertain_side_effect", "reconcile"}
FAULT_PARK_KINDS = {"interrupted_side_effect", "reconcile"}  # what a takeover after a fault parks on (I8)
UNCERTAIN_KIND = "uncertain_side_effect"
DECIDED = {"approved", "rejected", "confirmed"}
DECISION_TYPES = {
    "run.waiting_for_approval",
    "run.requeued",
    "run.failed",
    "run.cancelled",
    "run.completed",
    "run.fenced",
}


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    k = min(len(values) - 1, max(0, int(round(q * (len(values) - 1)))))
    return round(values[k], 3)


def _dist(values: list[float]) -> dict:
    return {
        "n": len(values),
        "p50": _pct(values, 0.5),
        "p95": _pct(values, 0.95),
        "max": round(max(values), 3) if values else None,
        "mean": round(statistics.mean(values), 3) if values else None,
    }


class _Violations(list):
    def add(self, invariant: str, detail: str, run: str | None = None, **extra) -> None:
        self.append({"invariant": invariant, "run": run, "detail": detail, **extra})


def _takeovers(events_by_run: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Per run: each `lease.taken_over` with what the takeover found in flight
    (its `step.interrupted` events, same epoch) and what it decided (the next
    outcome event written under the new epoch)."""
    out: dict[str, list[dict]] = {}
    for run_id, evs in events_by_run.items():
        lst = []
        for i, e in enumerate(evs):
            if e["type"] != "lease.taken_over":
                continue
            new_epoch = e["payload"].get("lease_epoch", e["lease_epoch"])
            unknown, decision, decision_payload, decision_at = [], None, None, None
            for f in evs[i + 1 :]:
                if f["type"] == "step.interrupted" and f["lease_epoch"] == new_epoch:
                    p = f["payload"]
                    if p.get("phase") == "executing" and p.get("read_only") is False:
                        unknown.append(p.get("invocation"))
                    continue
                if f["type"] == "run.fenced" and f["lease_epoch"] == new_epoch:
                    break  # the resumer lost its lease before deciding: its successor decides (below)
                if f["type"] in DECISION_TYPES and f["lease_epoch"] == new_epoch:
                    decision, decision_payload, decision_at = f["type"], f["payload"], f["occurred_at"]
                    break
                if f["type"] == "lease.taken_over":
                    break
            lst.append(
                {
                    "sequence": e["sequence"],
                    "at": e["occurred_at"],
                    "previous_epoch": e["payload"].get("previous_epoch"),
                    "epoch": new_epoch,
                    "via": e["payload"].get("via"),
                    "previous_owner": e["payload"].get("previous_owner"),
                    "unknown": unknown,
                    "decision": decision,
                    "decision_payload": decision_payload,
                    "decision_at": decision_at,
                }
            )
        # A resumer may die between its takeover and its decision (run_maintenance SIGKILLed mid-resume, its
        # connection cut): the next takeover, from the dead resumer's epoch, carries on. It finds the calls
        # already marked interrupted (no new step.interrupted) and makes the decision — so a takeover without a
        # decision hands its unknown effects on to its successor, and takes its successor's decision.
        succ = {}
        for i, t in enumerate(lst):
            succ[i] = next((j for j in range(i + 1, len(lst)) if lst[j]["previous_epoch"] == t["epoch"]), None)
        for i, t in enumerate(lst):
            j = succ[i]
            if t["decision"] is None and j is not None:
                lst[j]["unknown"] = list(dict.fromkeys(t["unknown"] + lst[j]["unknown"]))
                lst[j]["inherited_from_epoch"] = t["epoch"]
        for i in reversed(range(len(lst))):
            j = succ[i]
            if lst[i]["decision"] is None and j is not None:
                lst[i]["decision"], lst[i]["decision_payload"] = lst[j]["decision"], lst[j]["decision_payload"]
                lst[i]["decision_at"] = lst[j]["decision_at"]
                lst[i]["decided_by_epoch"] = lst[j].get("decided_by_epoch", lst[j]["epoch"])
        if lst:
            out[run_id] = lst
    return out


# -- I1: every run's end against what its plan and the recorded faults allow ---------


def _lease_loss_causes(events_by_run: dict, takeovers: dict, faults: list[dict], meta: dict):
    """For a run: which of its lease losses (takeovers) an injected fault
    caused, and which not. A loss of the lease of epoch E (claimed by worker
    P at tc, taken over at tt) is caused by a kill or stop that froze P
    holding E, or by a fault that reached P between tc and tt: a SIGKILL of
    P or of another process of P's node (its main process, sentinel, pusher,
    monitor or a sibling worker: the node replaces its queues, drains and
    stops workers), `pg_terminate_backend` of a backend of P's node (the
    deployment's processes connect as application_name soak-node-K), the
    PostgreSQL restart, or a SIGSTOP of P or of P's whole node (a worker
    stopped in the middle of its claim holds no lease yet when it is frozen,
    and has lost it when it goes on)."""
    nodes = _worker_nodes(meta)
    held = defaultdict(set)
    for f in faults:
        if f.get("kind") in ("kill", "stop"):
            for h in f.get("held") or []:
                held[h["run"]].add(h["epoch"])
    timed = sorted(
        (((f.get("t", f.get("t_freeze")) or 0.0), f) for f in faults if f.get("kind") in DEATH_KINDS + ("stop",)),
        key=lambda x: x[0],
    )
    timed_t = [t for t, _ in timed]

    def causes(run_id: str) -> tuple[list, list]:
        claims = {}
        for e in events_by_run.get(run_id, []):
            if e["type"] in ("run.claimed", "lease.taken_over"):  # a takeover's epoch is held by its resumer
                owner = (e["payload"] or {}).get("lease_owner") or ""
                parts = owner.split(":")
                claims[(e["payload"] or {}).get("lease_epoch", e["lease_epoch"])] = (
                    e["occurred_at"],
                    int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None,
                    # who held it: a worker claimed it, or took it over from its doorbell (drive_run finding
                    # the lease expired); a sweep's takeover is held by run_maintenance
                    "worker"
                    if e["type"] == "run.claimed" or e["payload"].get("via") == "drive_run"
                    else ("maintenance" if e["payload"].get("via") == "sweep" else None),
                )
        caused, uncaused = [], []
        for t in takeovers.get(run_id, []):
            epoch = t["previous_epoch"]
            if epoch in held[run_id]:
                caused.append({"epoch": epoch, "by": "a kill/stop of its worker"})
                continue
            tc, pid, holder = claims.get(epoch, (None, None, None))
            # pids are reused over a long soak: who held the epoch says which map to read
            node = nodes.get(pid) if holder == "worker" else None
            app = f"soak-node-{node}" if node is not None else ("soak-maintenance" if holder == "maintenance" else None)
            why = None
            start = bisect.bisect_left(timed_t, tc - 0.5) if tc is not None else len(timed)
            for tf, f in timed[start:]:
                if tf > t["at"]:
                    break
                if f["kind"] == "pg_restart":
                    why = "the PostgreSQL restart"
                elif f["kind"] == "terminate" and app is not None and f.get("application_name") == app:
                    why = f"pg_terminate_backend of a {app} backend"
                elif (
                    f["kind"] == "kill"
                    and holder == "maintenance"
                    and f.get("role") == "run_maintenance"
                    and f.get("pid") == pid
                ):
                    why = "SIGKILL of run_maintenance, the resumer holding it"
                elif (
                    f["kind"] == "kill"
                    and holder == "worker"
                    and (
                        f.get("pid") == pid
                        or (node is not None and f.get("node") == node and f.get("role") in NODE_ROLES)
                    )
                ):
                    whose = "its worker" if f.get("pid") == pid else f"its node {node}'s {f.get('role')}"
                    why = f"SIGKILL of {whose}"
                elif f["kind"] == "stop" and holder == "worker" and pid is not None:
                    if f.get("role") == "node" and pid in (f.get("pids") or []):
                        why = f"SIGSTOP of its whole node {f.get('node')}"
                    elif f.get("role") != "node" and f.get("pid") == pid:
                        why = "SIGSTOP of its worker"
                if why:
                    break
            (caused if why else uncaused).append(
                {"epoch": epoch, "by": why} if why else {"epoch": epoch, "worker": pid, "node": node}
            )
        return caused, uncaused

    return causes


def _worker_nodes(meta: dict) -> dict[int, int]:
    """Worker pid -> node: the soak's process-table reads, completed from each
    node's log (django-q2 logs every worker it starts), so a worker that
    lived between two reads is still tied to its node."""
    nodes: dict[int, int] = {}
    for name, counts in (meta.get("process_logs") or {}).items():
        prefix, _, k = name.rpartition("-")
        if prefix == "qcluster" and k.isdigit():
            for pid in counts.get("worker_pids") or []:
                nodes[int(pid)] = int(k)
    nodes.update({int(k): v for k, v in (meta.get("worker_nodes") or {}).items()})
    return nodes


NODE_ROLES = ("busy_worker", "idle_worker", "pusher", "monitor", "sentinel", "qcluster_main")


def _judge_outcomes(
    runs: dict,
    approvals: list[dict],
    faults: list[dict],
    decisions: list[dict],
    meta: dict,
    doorbells: dict,
    v: _Violations,
    lease_losses=None,
    judged: dict | None = None,
) -> dict:
    """I1 judges outcomes, not only termination. A run may end COMPLETED;
    CANCELLED only if the soak recorded an operator cancel of it; FAILED only
    for a reason some recorded fault or decision caused (`operator_rejected`
    after an operator rejected one of its approvals; `max_attempts_exceeded`
    when injected faults alone took its lease away more than the limit allows);
    parked (WAITING_FOR_APPROVAL) only on a pending approval a fault caused
    (interrupted_side_effect / uncertain_side_effect / reconcile). An
    uncertain call the operator confirmed goes on to COMPLETED; one rejected
    ends FAILED operator_rejected, like an interrupted one. Anything else — `internal_error`, a
    reason no fault explains, a run left RUNNING / QUEUED — is a violation.
    COMPLETED is judged like any other end (`_cannot_complete`): a run that
    completed although the recorded decisions and faults say it cannot — the
    operator rejected one of its side effects, nobody decided one of its
    unknown outcomes, a cancel ended it on the spot — is a violation.
    Every end is listed with its count, explained or not."""
    cancelled = {f.get("run") for f in faults if f.get("kind") == "cancel" and f.get("run")}
    rejected = defaultdict(list)
    for a in approvals:
        if a["status"] == "rejected" and a.get("decided_at") is not None:
            rejected[a["run_id"]].append(a["id"])
    operator_rejects = {d["approval"] for d in decisions if d.get("ok") and d.get("decision") == "reject"}
    held = Counter(h["run"] for f in faults if f.get("kind") in ("kill", "stop") for h in (f.get("held") or []))
    pending = defaultdict(list)
    for a in approvals:
        if a["status"] == "pending":
            pending[a["run_id"]].append(a["kind"])
    max_exp = meta.get("max_lease_expirations", 3)
    blocked = _cannot_complete(approvals, faults, decisions)
    ends: dict[str, dict] = {}

    def note(end: str, ok: bool, run_id: str, why: str) -> None:
        e = ends.setdefault(end, {"n": 0, "explained": 0, "unexplained": 0, "why": Counter()})
        e["n"] += 1
        e["explained" if ok else "unexplained"] += 1
        e["why"][why] += 1
        if not ok:
            r = runs[run_id]
            v.add(
                "I1",
                f"run ended {end} ({why}; plan {r.get('plan', '?')}, lease_owner={r['lease_owner']}, "
                f"epoch={r['lease_epoch']}, "
                f"drive_run doorbells: {doorbells.get(run_id) or 'none'})",
                run_id,
            )

    for run_id, r in runs.items():
        status = r["status"]
        if status == "COMPLETED":
            why_not = blocked.get(run_id)
            note("COMPLETED", not why_not, run_id, why_not or "completed")
        elif status == "CANCELLED":
            if run_id in cancelled:
                note("CANCELLED", True, run_id, "the operator cancelled it")
            else:
                note("CANCELLED", False, run_id, "no recorded cancel")
        elif status == "FAILED":
            reason = (r.get("failure") or {}).get("reason")
            end = f"FAILED:{reason}"
            if reason == "operator_rejected":
                ids = rejected.get(run_id) or []
                ok = bool(ids) and (not decisions or any(i in operator_rejects for i in ids))
                note(end, ok, run_id, "the operator rejected its approval" if ok else "no recorded operator rejection")
            elif reason == "max_attempts_exceeded":
                if lease_losses is not None:
                    caused, uncaused = lease_losses(run_id)
                    ok = len(caused) > max_exp
                    note(
                        end,
                        ok,
                        run_id,
                        f"{len(caused)} lease losses, each caused by an injected fault (limit {max_exp})"
                        if ok
                        else f"{len(caused)} lease loss(es) caused by injected faults, the limit is {max_exp}; not "
                        f"caused: {uncaused}",
                    )
                else:
                    ok = held[run_id] > max_exp
                    note(
                        end,
                        ok,
                        run_id,
                        f"{held[run_id]} injected faults held it (limit {max_exp})"
                        if ok
                        else f"only {held[run_id]} injected fault(s) held it, the limit is {max_exp} lease losses",
                    )
            elif reason == "reconcile_conflict":
                conflict = [
                    j for j in (judged or {}).values() if j["run"] == run_id and j["ok"] and j["answer"] == "conflict"
                ]
                note(
                    end,
                    bool(conflict),
                    run_id,
                    "its tool's reconciler answered conflict" if conflict else "no reconciler answered conflict",
                )
            else:
                note(end, False, run_id, "no fault or decision of the soak causes this failure")
        elif status == "WAITING_FOR_APPROVAL" and pending.get(run_id):
            kinds = pending[run_id]
            ok = all(k in RERUN_KINDS for k in kinds)
            note(
                "PARKED",
                ok,
                run_id,
                "waiting on an unknown outcome's approval" if ok else f"waiting on approvals {kinds}",
            )
        else:
            note(status, False, run_id, "not terminal and not parked on an approval")
    for e in ends.values():
        e["why"] = dict(e["why"])
    return dict(sorted(ends.items()))


def _cannot_complete(approvals: list[dict], faults: list[dict], decisions: list[dict]) -> dict[str, str]:
    """The runs the recorded decisions and faults say cannot end COMPLETED,
    each with why: the operator rejected one of its side effects whose
    outcome was unknown (an interrupted_side_effect, uncertain_side_effect or
    reconcile approval; the rejection ends the run FAILED operator_rejected,
    so the effect its plan needs never happens), by the approval's row or by
    an acknowledged `reject` in the operator's log; such an approval of it is
    still pending (nobody decided the unknown outcome); or a cancel ended it
    CANCELLED on the spot (it was QUEUED or waiting). A cancel that only
    noted a RUNNING run may come after its last observation point, and a
    policy approval's rejection is a denial the model sees and the run may
    go on: neither says anything here."""
    kind_of = {a["id"]: a["kind"] for a in approvals}
    run_of = {a["id"]: a["run_id"] for a in approvals}
    why: dict[str, str] = {}
    for a in approvals:
        if a["kind"] not in RERUN_KINDS:
            continue
        if a["status"] == "rejected":
            why.setdefault(a["run_id"], f"the operator rejected its {a['kind']} approval {a['id']}")
        elif a["status"] == "pending":
            why.setdefault(a["run_id"], f"its {a['kind']} approval {a['id']} was never decided")
    for d in decisions:
        if d.get("ok") and d.get("decision") == "reject" and kind_of.get(d["approval"], d.get("kind")) in RERUN_KINDS:
            run = run_of.get(d["approval"], d.get("run"))
            why.setdefault(run, f"the operator rejected its {d.get('kind')} approval {d['approval']} (its log says)")
    for f in faults:
        if f.get("kind") == "cancel" and f.get("run") and f.get("status_after") == "CANCELLED":
            why.setdefault(f["run"], f"a cancel at {f.get('t')} ended it CANCELLED on the spot")
    return why


# -- I2: effects by content, ordered against the decisions that permit a re-send ---------


def _check_effects(sink: list[dict], invs: dict, inv_by_key: dict, approvals: list[dict], v: _Violations):
    confirmed = {a.get("invocation_id") for a in approvals if a["status"] == "confirmed"}
    """An effect is (run, tool, URL path, body hash): what was delivered, not
    the key it came with. The soak's scripts ask for each effect once, so the
    first delivery is free and every later one — under any key — needs its
    own recorded decision permitting it: an operator's approval of a re-run
    (interrupted_side_effect after a process death, uncertain_side_effect
    after a live call's answer was lost, or a reconciler's `reconcile` pause)
    of the invocation whose key the re-send carries, decided strictly before
    the send arrived at the sink. One decision permits one re-send. A
    `confirmed` approval (the operator said whether it took effect) and a
    rejected one permit nothing: a send after either is a violation.

    Clocks: the sink stamps each POST with time.time_ns() (CLOCK_REALTIME) on
    arrival; approvals.decided_at is the deciding process's CLOCK.now() (also
    CLOCK_REALTIME), written before its COMMIT, and a re-send can only start
    after that COMMIT. All processes run on one machine, so they read one
    kernel clock; the comparison is sound as long as the clock is not stepped
    during the soak (NTP slewing keeps it ordered). The sink also records
    CLOCK_MONOTONIC (`mono_ns`, system-wide on Linux) to order sends among
    themselves, immune to a step."""
    sends_by_key: dict[str, list[dict]] = defaultdict(list)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for s in sink:
        sends_by_key[s.get("key")].append(s)
        inv = inv_by_key.get(s.get("key"))
        body = s.get("body_sha256") or _sha(s.get("body"))
        run = inv["run_id"] if inv else None
        groups[(run, inv["tool_name"] if inv else None, s.get("path"), body)].append(s)
    permits: dict[str, list[float]] = defaultdict(list)
    for a in approvals:
        if a["kind"] in RERUN_KINDS and a["status"] == "approved" and a.get("invocation_id"):
            permits[a["invocation_id"]].append(a.get("decided_at"))
    for key, sends in sends_by_key.items():
        inv = inv_by_key.get(key)
        if inv is None:
            v.add("I2", f"{len(sends)} send(s) with Idempotency-Key {key!r} that names no invocation")
            continue
        for attempt, n in Counter(s.get("attempt") for s in sends).items():
            if n > 1:
                v.add(
                    "I2",
                    f"invocation {inv['id']} attempt {attempt} sent {n} times (one watermark, several sends)",
                    inv["run_id"],
                )
    dup_sends, multi = 0, 0
    for (run, tool, path, body), sends in groups.items():
        if run is None or len(sends) < 2:
            continue
        multi += 1
        dup_sends += len(sends) - 1
        order = sorted(sends, key=lambda s: (s.get("mono_ns") is None, s.get("mono_ns") or 0, s.get("t_ns") or 0))
        left = {i: sorted(t for t in ts if t is not None) for i, ts in permits.items()}
        keys = sorted({s.get("key") for s in sends})
        for k, s in enumerate(order[1:], start=2):
            inv = inv_by_key[s.get("key")]
            t = s.get("t_ns")
            avail = left.get(inv["id"]) or []
            if t is None:
                v.add(
                    "I2",
                    f"effect {path} of tool {tool} delivered {len(sends)} times (keys {keys}); delivery #{k} has no "
                    f"timestamp, so it cannot be ordered against a decision",
                    run,
                )
                continue
            before = [d for d in avail if d < t / 1e9]
            if before:
                avail.remove(before[0])
                continue
            later = [d for d in (permits.get(inv["id"]) or []) if d is not None and d >= t / 1e9]
            why = (
                f"its only permitting decision(s) came {min(later) - t / 1e9:.3f} s after it"
                if later
                else "no recorded decision permits it"
            )
            v.add(
                "I2",
                f"effect {path} of tool {tool} delivered {len(sends)} times (keys {keys}); delivery #{k} under key "
                f"{s.get('key')!r} (attempt {s.get('attempt')}): {why}",
                run,
                body_sha256=body,
            )
    lost = 0
    for inv in invs.values():
        if inv["id"] in confirmed:
            continue  # completed on the operator's word (took_effect), not by a send
        if not inv["read_only"] and inv["status"] == "completed" and not sends_by_key.get(inv["idempotency_key"]):
            lost += 1
            v.add(
                "I2",
                f"side-effect invocation {inv['id']} is completed but the sink never received it (lost effect)",
                inv["run_id"],
            )
    return (
        sends_by_key,
        dup_sends,
        {
            "effects": sum(1 for g in groups if g[0] is not None),
            "delivered_more_than_once": multi,
            "unordered_sends": sum(1 for s in sink if s.get("t_ns") is None),
            "lost_effects": lost,
        },
    )


def _sha(body) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# -- I3: every row against the epoch in force when it was written -----------------------

ROW_TABLES = ("events", "invocations", "model_calls", "checkpoints")


def _check_rows_against_epochs(snapshot: dict, runs: dict, events_by_run: dict, v: _Violations) -> dict:
    """Any row of a run written with an epoch older than the run's epoch at
    the time of the write is a violation.

    "At the time of the write" is PostgreSQL's transaction order: the soak
    snapshots every row's `xmin` (the id of the transaction that wrote its
    current version). A run's epoch changes only in a transaction that also
    inserts `run.claimed` or `lease.taken_over` with the new epoch, so the
    epoch in force for a transaction X is the highest epoch among those
    events whose xmin <= X. Transaction ids are handed out at a
    transaction's first write, and the takeover's first write is the run
    row's UPDATE that takes the row lock; a zombie that got its id later
    must pass its fence (`UPDATE runs ... WHERE lease_epoch = old`) after
    that lock, i.e. after the takeover committed, and so cannot write — a
    committed old-epoch row with a later id is exactly the bug. (xid order
    is not commit order in general; the row lock makes it one here. xmin is
    the 32-bit id, shared by the whole server: if the ids in the snapshot
    span more than 2^31 the counter wrapped during the soak and the check
    is skipped, saying so.)

    The row's epoch is its own `lease_epoch`, or the epoch of the events the
    same transaction wrote for that run, whichever is higher: writers that
    are not the lease holder (an operator's approval or cancel, the
    takeover's own updates) write an event at the run's current epoch in the
    same transaction. `run.fenced` is exempt: it is the zombie's record of
    having been fenced, written outside the fence by design. Only a row's
    latest version carries an xmin: an old-epoch write later overwritten by
    a legitimate one is not seen (events and checkpoints are never
    updated)."""
    have_xid = all("xid" in row for t in ROW_TABLES for row in snapshot.get(t) or [])
    checked = 0
    if not have_xid:
        return {"rows_checked": 0, "xid": False}
    xids = [row["xid"] for t in ROW_TABLES for row in snapshot.get(t) or []]
    if xids and max(xids) - min(xids) >= 2**31:
        return {"rows_checked": 0, "xid": "wrapped"}
    changes: dict[str, list[tuple[int, int]]] = defaultdict(list)
    tx_epoch: dict[tuple[str, int], int] = {}
    for run_id, evs in events_by_run.items():
        for e in evs:
            if e["type"] in ("run.claimed", "lease.taken_over"):
                changes[run_id].append((e["xid"], e["payload"].get("lease_epoch", e["lease_epoch"])))
            if e["type"] != "run.fenced":
                k = (run_id, e["xid"])
                tx_epoch[k] = max(tx_epoch.get(k, -1), e["lease_epoch"])
    for lst in changes.values():
        lst.sort()
    for table in ROW_TABLES:
        for row in snapshot.get(table) or []:
            run_id = row.get("run_id")
            if run_id not in runs or (table == "events" and row["type"] == "run.fenced"):
                continue
            checked += 1
            x = row["xid"]
            in_force = max((ep for xid, ep in changes.get(run_id, []) if xid <= x), default=0)
            mine = max(row["lease_epoch"], tx_epoch.get((run_id, x), -1))
            if mine < in_force:
                what = f"event #{row['sequence']} {row['type']}" if table == "events" else f"{table} row"
                v.add(
                    "I3",
                    f"{what} written at epoch {mine} by transaction {x}, after epoch {in_force} was in force",
                    run_id,
                )
            r = runs[run_id]
            if row["lease_epoch"] > r["lease_epoch"]:
                v.add(
                    "I3",
                    f"{table} row written at epoch {row['lease_epoch']} > the run's epoch {r['lease_epoch']}",
                    run_id,
                )
    return {"rows_checked": checked, "xid": True}


# -- unknown outcomes without a process death (issue 11): covered like a fault in the watermark window ---


def _uncertain_outcomes(events_by_run: dict, invs: dict) -> list[dict]:
    """Every side-effect call that ended `uncertain` in a live run (its `tool.call.failed` event says
    `outcome: uncertain`, `awaiting_decision`), with the decision that followed it."""
    outcomes = []
    for run_id, evs in events_by_run.items():
        for i, e in enumerate(evs):
            p = e["payload"]
            if e["type"] != "tool.call.failed" or p.get("outcome") != "uncertain" or not p.get("awaiting_decision"):
                continue
            inv = invs.get(p.get("invocation")) or {}
            if inv.get("read_only"):
                continue
            nxt = next((f for f in evs[i + 1 :] if f["type"] in DECISION_TYPES), None)
            cause = (p.get("error") or {}).get("error") if isinstance(p.get("error"), dict) else None
            outcomes.append(
                {
                    "run": run_id,
                    "invocation": p.get("invocation"),
                    "attempt": p.get("attempt"),
                    "tool": p.get("tool"),
                    "cause": cause,
                    "epoch": e["lease_epoch"],
                    "sequence": e["sequence"],
                    "at": e["occurred_at"],
                    "window": "watermark_to_result" if inv.get("effect_sent_at") is not None else "before_watermark",
                    "next": nxt["type"] if nxt else None,
                    "next_payload": (nxt or {}).get("payload") or {},
                    "next_at": nxt["occurred_at"] if nxt else None,
                }
            )
    return outcomes


def _check_uncertain(
    outcomes: list[dict],
    runs: dict,
    inv_by_key: dict,
    approvals: list[dict],
    faults: list[dict],
    sink: list[dict],
    reconciler: bool,
    judged: dict,
    v: _Violations,
) -> dict:
    """Every side-effect call that ended `uncertain` in a live run must end
    in a recorded decision about that very attempt, exactly like a kill
    between the watermark and the result: an `uncertain_side_effect`
    approval of (invocation, attempt) — whether the executing worker parked it
    or a takeover did after a fault — or, when its tool has a reconciler, the
    decision its reconciler's answer calls for (`_judge_reconciled`: a
    `reconcile` approval of that attempt when it answered `waiting`), or with
    a global reconciler configured, its answer, or the operator's cancel of
    the run. Conversely every `uncertain_side_effect` approval must name an
    attempt that ended uncertain. Re-sends are I2's business (a decision must
    precede them).

    Counted per tool, per cause (the tool's error code: timeout, closed, …)
    and per window: an uncertain outcome is a call sent and not answered, so
    its window is `watermark_to_result` when the invocation's watermark is
    recorded (anything else is reported as it is). The sink's own log says
    which POSTs it dropped (`close`) or answered late (`delay:S`)."""
    parks = {(a["invocation_id"], a.get("attempt")): a for a in approvals if a["kind"] == UNCERTAIN_KIND}
    reconcile_parks = {(a["invocation_id"], a.get("attempt")) for a in approvals if a["kind"] == "reconcile"}
    cancelled = {f.get("run") for f in faults if f.get("kind") == "cancel" and f.get("run")}
    seen, explained, unexplained = set(), [], []
    parked_by_reconciler = 0
    for o in outcomes:
        key = (o["invocation"], o["attempt"])
        seen.add(key)
        item = {k: o[k] for k in ("run", "invocation", "attempt", "tool", "cause")}
        reason = (o["next_payload"].get("failure") or {}).get("reason") if o["next"] == "run.failed" else None
        rj = judged.get(("uncertain", o["invocation"], o["attempt"]))
        if rj is not None:  # its tool has a reconciler: the decision must be the one its answer calls for
            if not rj["ok"]:
                unexplained.append({**item, "why": rj["why"], "reported": True})
            elif rj["answer"] == "waiting" and key in reconcile_parks:
                parked_by_reconciler += 1
            elif rj["answer"] == "waiting":
                unexplained.append({**item, "why": f"{rj['why']}, but no reconcile approval names this attempt"})
            else:
                explained.append({**item, "why": rj["why"]})
            continue
        if key in parks:
            continue
        if reconciler and (o["next"] in ("run.requeued", "run.completed") or reason == "reconcile_conflict"):
            explained.append({**item, "why": f"the reconciler answered ({o['next']})"})
        elif runs.get(o["run"], {}).get("status") == "CANCELLED" and o["run"] in cancelled:
            explained.append({**item, "why": "the operator cancelled the run before a decision"})
        else:
            unexplained.append(
                {
                    **item,
                    "why": f"ended uncertain and was followed by {o['next'] or 'nothing'}"
                    + (f" ({reason})" if reason else "")
                    + ", not a park, a reconciler's answer or a cancel",
                }
            )
    orphan_parks = [
        {"approval": a["id"], "run": a["run_id"], "invocation": a["invocation_id"], "attempt": a.get("attempt")}
        for k, a in parks.items()
        if k not in seen
    ]
    for item in unexplained:
        if item.get("reported"):
            continue  # _judge_reconciled said so
        v.add(
            "I8",
            f"invocation {item['invocation']} attempt {item['attempt']} ({item['tool']}, {item['cause']}) "
            f"{item['why']}",
            item["run"],
        )
    for item in orphan_parks:
        v.add(
            "I8",
            f"uncertain_side_effect approval {item['approval']} names invocation {item['invocation']} attempt "
            f"{item['attempt']}, which never ended uncertain",
            item["run"],
        )
    dropped = [s for s in sink if s.get("behaviour")]
    interrupted = {(a["invocation_id"], a.get("attempt")) for a in approvals if a["kind"] in FAULT_PARK_KINDS}
    produced = overtaken = 0
    for s in dropped:
        inv = inv_by_key.get(s.get("key"))
        key = (
            inv["id"] if inv else None,
            int(s["attempt"]) if str(s.get("attempt") or "").isdigit() else s.get("attempt"),
        )
        if key in seen:
            produced += 1
        elif key in interrupted:
            overtaken += 1  # the worker was killed / stopped while it waited for the answer: parked as interrupted (I8)
    by_status = Counter(a["status"] for a in parks.values())
    return {
        "outcomes": len(outcomes),
        "by_tool": dict(Counter(o["tool"] for o in outcomes)),
        "by_cause": dict(Counter(str(o["cause"]) for o in outcomes)),
        "by_window": {w: sum(1 for o in outcomes if o["window"] == w) for w in ALL_WINDOWS},
        "approvals": len(parks),
        "approvals_by_status": dict(by_status),
        "parked": sum(1 for o in outcomes if (o["invocation"], o["attempt"]) in parks),
        "parked_by_reconciler": parked_by_reconciler,
        "explained_otherwise": explained,
        "unexplained": unexplained,
        "parks_unexplained": orphan_parks,
        "equal": not unexplained and not orphan_parks,
        "sink_faults": dict(
            Counter("held_for_restart" if s.get("held_for_restart") else s["behaviour"].split(":")[0] for s in dropped)
        ),
        "sink_faults_that_ended_uncertain": produced,
        "sink_faults_overtaken_by_a_process_fault": overtaken,
    }


# -- tools that reconcile their own calls (issue 33 item 6): part of the runs -------------------------------

# a reconciler reads the sink's log; the sink stamps a POST on arrival and logs it once its body is read
RECONCILE_SLACK_S = 1.0
# the decision each answer calls for (runs/runtime/resume.py `_reconcile`)
DECISION_FOR = {
    "conflict": "run.failed",
    "waiting": "run.waiting_for_approval",
    "completed": "run.completed",
    "continue": "run.requeued",
}


def _judge_reconciled(
    runs: dict,
    invs: dict,
    takeovers: dict,
    uncertain: list[dict],
    reconciles: list[dict],
    sink: list[dict],
    faults: list[dict],
    meta: dict,
    v: _Violations,
) -> tuple[dict, dict]:
    """The runs whose side-effect tool has a reconciler (meta
    `reconciled_tools`; the soak's `reconciled_post`, tests/chaos/tools.py):
    Resume asks the tool's reconciler instead of an operator, and each answer
    is in its log (`reconciles`: what it read of the sink, when, and what it
    answered). Judged twice:

    1. the answer itself: the reconciler's rule (tests/chaos/plans.py `rule`:
       `conflict` for a seeded share of the keys, else `continue` when the sink
       holds the key, else `waiting`) applied to what it saw, and what it saw
       against the sink's log — every attempt of the key the sink logged more
       than RECONCILE_SLACK_S before it read must be in it, and nothing the
       sink never logged;
    2. the runtime's decision at every unknown outcome of such a call — a
       takeover that found it in flight (the decider's, when a resumer died
       before deciding) or a live call that ended uncertain: the latest answer
       asked between the unknown outcome and the decision (the strongest
       across the calls, as runs/tools/reconcile.py combines them) calls for
       one decision (DECISION_FOR; `conflict` fails the run
       `reconcile_conflict`), and that must be the one taken. A decision
       without an answer is a violation too — save `run.cancelled` when the
       operator's cancel was requested before it: Resume ends a run whose
       cancel is pending before it asks anyone, the same rule the checker
       applies to an operator's question (I8, `_check_uncertain`).

    Returns the judgement per decision point — ("takeover", run, epoch) or
    ("uncertain", invocation, attempt) → {ok, answer, decision, why} — for
    I1, I8 and the uncertain accounting, and a summary."""
    from tests.chaos.plans import STRENGTH, rule

    tools = set(meta.get("reconciled_tools") or [])
    cfg = meta.get("reconcile_rule") or {}
    seed, share = str(cfg.get("seed", "")), float(cfg.get("conflict_share") or 0)

    def reconciled(inv_id) -> bool:
        return (invs.get(inv_id) or {}).get("tool_name") in tools

    sink_by_key: dict[str, list[dict]] = defaultdict(list)
    for s in sink:
        sink_by_key[str(s.get("key"))].append(s)
    entries: dict[str, list[dict]] = defaultdict(list)
    wrong = []
    for e in reconciles:
        entries[str(e.get("invocation"))].append(e)
        key = e.get("key") or ""
        seen = {str(a) for a in e.get("seen") or []}
        logged = [x for x in sink_by_key.get(key, []) if x.get("t_ns") is not None]
        must_see = {str(x.get("attempt")) for x in logged if x["t_ns"] / 1e9 < e["t_read"] - RECONCILE_SLACK_S}
        could_see = {str(x.get("attempt")) for x in logged if x["t_ns"] / 1e9 <= e["t"] + RECONCILE_SLACK_S}
        problems = []
        want = rule(seed, key, share, sorted(seen))
        if e.get("answer") != want:
            problems.append(f"answered {e.get('answer')} where its rule gives {want}")
        if must_see - seen:
            problems.append(f"did not see attempt(s) {sorted(must_see - seen)} the sink had logged before it read")
        if seen - could_see:
            problems.append(f"saw attempt(s) {sorted(seen - could_see)} the sink had not logged")
        if problems:
            wrong.append({"invocation": e.get("invocation"), "run": e.get("run"), "problems": problems})
            v.add("I8", f"the reconciler of invocation {e.get('invocation')}: {'; '.join(problems)}", e.get("run"))

    points = []
    for run_id, lst in takeovers.items():
        for t in lst:
            unk = [i for i in t["unknown"] if reconciled(i)]
            if not unk or "decided_by_epoch" in t:
                continue  # no reconciled call, or the successor that decided is judged instead
            points.append(
                {
                    "key": ("takeover", run_id, t["epoch"]),
                    "run": run_id,
                    "calls": [(i, None) for i in unk],
                    "mixed": len(unk) != len(t["unknown"]),
                    "start": t["at"],
                    "decision": t["decision"],
                    "payload": t["decision_payload"] or {},
                    "decision_at": t["decision_at"],
                }
            )
    for o in uncertain:
        if reconciled(o["invocation"]):
            points.append(
                {
                    "key": ("uncertain", o["invocation"], o["attempt"]),
                    "run": o["run"],
                    "calls": [(o["invocation"], o["attempt"])],
                    "mixed": False,
                    "start": o["at"],
                    "decision": o["next"],
                    "payload": o["next_payload"],
                    "decision_at": o["next_at"],
                }
            )
    cancelled = {f.get("run") for f in faults if f.get("kind") == "cancel" and f.get("run")}
    judged: dict[tuple, dict] = {}
    for pt in points:
        d, end = pt["decision"], pt["decision_at"]
        asked_at = (runs.get(pt["run"]) or {}).get("cancel_requested_at")
        if (
            d == "run.cancelled"
            and pt["run"] in cancelled
            and asked_at is not None
            and end is not None
            and asked_at <= end
        ):
            why = "the operator had cancelled the run before a decision (Resume ends it before asking the reconciler)"
            judged[pt["key"]] = {"ok": True, "answer": None, "decision": d, "why": why, "run": pt["run"]}
            continue
        answers, missing = [], []
        for inv, attempt in pt["calls"]:
            cands = [
                e
                for e in entries.get(inv, [])
                if end is not None
                and pt["start"] <= e["t_read"] <= end
                and (attempt is None or e.get("attempt") == attempt)
            ]
            if cands:
                answers.append(max(cands, key=lambda e: e["t_read"]))
            else:
                missing.append(inv)
        reason = ((pt["payload"].get("failure") or {}).get("reason")) if d == "run.failed" else None
        strongest = min((e["answer"] for e in answers), key=lambda a: STRENGTH.get(a, 9)) if answers else None
        if d is None:
            ok, why = False, "no decision followed the unknown outcome of a call whose tool has a reconciler"
        elif pt["mixed"]:
            ok, why = False, "a call whose tool has a reconciler and one whose tool has none were unknown at once"
        elif missing:
            ok, why = False, f"decided {d} without an answer of its tool's reconciler (invocations {missing})"
        else:
            want = DECISION_FOR.get(strongest or "", "?")
            ok = d == want and (strongest != "conflict" or reason == "reconcile_conflict")
            sink_says = (
                "the sink holds the key" if any(e.get("seen") for e in answers) else "the sink has no POST of it"
            )
            why = f"its tool's reconciler answered {strongest} ({sink_says}); the runtime decided {d}" + (
                f" ({reason})" if reason else ""
            )
            if not ok:
                why += f", where the answer calls for {want}"
        judged[pt["key"]] = {"ok": ok, "answer": strongest, "decision": d, "why": why, "run": pt["run"]}
        if not ok:
            v.add("I8", why, pt["run"])
    summary = {
        "tools": sorted(tools),
        "runs": len({i["run_id"] for i in invs.values() if i["tool_name"] in tools}),
        "answers": len(reconciles),
        "answers_by_outcome": dict(sorted(Counter(e.get("answer") for e in reconciles).items())),
        "answers_wrong": wrong,
        "decisions": len(judged),
        "decisions_by_kind": dict(Counter(k[0] for k in judged)),
        "decisions_by_answer": dict(
            sorted(Counter(j["answer"] or "none (cancelled first)" for j in judged.values()).items())
        ),
        "followed": sum(1 for j in judged.values() if j["ok"]),
        "not_followed": [{"point": list(k), **j} for k, j in judged.items() if not j["ok"]],
    }
    return judged, summary


def check(
    snapshot: dict,
    sink: list[dict],
    faults: list[dict],
    decisions: list[dict] | None = None,
    reconciles: list[dict] | None = None,
) -> dict:
    """`reconciles`: the log of the tools' reconcilers (one dict per answer, tests/chaos/tools.py)."""
    decisions = list(decisions or [])
    v = _Violations()
    meta = snapshot.get("meta", {})
    runs = {r["id"]: r for r in snapshot["runs"]}
    invs = {i["id"]: i for i in snapshot["invocations"]}
    inv_by_key = {i["idempotency_key"]: i for i in snapshot["invocations"]}
    approvals = snapshot["approvals"]
    events_by_run: dict[str, list[dict]] = defaultdict(list)
    events_by_session: dict[str, list[dict]] = defaultdict(list)
    for e in snapshot["events"]:
        events_by_session[e["session_id"]].append(e)
        if e["run_id"]:
            events_by_run[e["run_id"]].append(e)
    for lst in list(events_by_run.values()) + list(events_by_session.values()):
        lst.sort(key=lambda e: e["sequence"])
    takeovers = _takeovers(events_by_run)
    kills = [f for f in faults if f.get("kind") == "kill"]
    stops = [f for f in faults if f.get("kind") == "stop"]
    uncertain_outcomes = _uncertain_outcomes(events_by_run, invs)
    judged, reconcilers = _judge_reconciled(
        runs, invs, takeovers, uncertain_outcomes, list(reconciles or []), sink, faults, meta, v
    )

    # ---- I1 no lost run --------------------------------------------------
    expected = meta.get("runs_submitted")
    if expected is not None and expected != len(runs):
        v.add("I1", f"{expected} runs submitted but {len(runs)} in the database")
    t_end = meta.get("t_end") or 0
    doorbells: dict[str, list[str]] = defaultdict(list)
    for d in snapshot.get("doorbells") or []:  # django-q2 ORM broker rows left at the end
        lock = d.get("lock")
        state = (
            "waiting in the queue"
            if lock is None or lock <= t_end
            else f"dequeued by a pusher, locked until +{lock - t_end:.0f}s"
        )
        doorbells[d.get("run")].append(state)
    # reports with process roles (issue 14's soak) attribute each lease loss to the fault that caused it
    with_roles = any(f.get("role") for f in faults)
    outcomes = _judge_outcomes(
        runs,
        approvals,
        faults,
        decisions,
        meta,
        doorbells,
        v,
        _lease_loss_causes(events_by_run, takeovers, faults, meta) if with_roles else None,
        judged,
    )
    logs_judged = _judge_logs(meta.get("process_logs") or {}, faults, v)
    for err in meta.get("submit_errors") or []:
        v.add(
            "I1",
            f"the submit of run #{err['index']} was refused: {err['error']} (a run the soak asked for does not exist)",
        )

    # ---- I2 no unapproved duplicate effect (by content, ordered against decisions) ----
    sends_by_key, dup_sends, effects = _check_effects(sink, invs, inv_by_key, approvals, v)

    # ---- I3 fencing --------------------------------------------------------
    for run_id, evs in events_by_run.items():
        high = -1
        for e in evs:
            if e["type"] == "run.fenced":
                continue
            if e["lease_epoch"] < high:
                v.add(
                    "I3",
                    f"event #{e['sequence']} {e['type']} carries epoch {e['lease_epoch']} after epoch {high} was "
                    "written",
                    run_id,
                )
            high = max(high, e["lease_epoch"])
        r = runs.get(run_id)
        if r and r["status"] in TERMINAL:
            for e in evs:
                if e["type"] == "run.fenced" and e["lease_epoch"] >= r["lease_epoch"]:
                    v.add(
                        "I3",
                        f"run.fenced at epoch {e['lease_epoch']} but the run ended at epoch {r['lease_epoch']}",
                        run_id,
                    )
    fencing = _check_rows_against_epochs(snapshot, runs, events_by_run, v)

    # ---- I4 contiguous event sequences per session ------------------------
    sessions = {s["id"]: s for s in snapshot["sessions"]}
    for sid, evs in events_by_session.items():
        seqs = [e["sequence"] for e in evs]
        if seqs != list(range(1, len(seqs) + 1)):
            missing = sorted(set(range(1, max(seqs) + 1)) - set(seqs))
            dupes = [s for s, n in Counter(seqs).items() if n > 1]
            v.add("I4", f"session {sid}: sequence gaps {missing[:10]} dupes {dupes[:10]}")
        s = sessions.get(sid)
        if s is not None and seqs and s["event_seq"] != seqs[-1]:
            v.add("I4", f"session {sid}: counter {s['event_seq']} but last event #{seqs[-1]}")

    # ---- I5 no lease while waiting (nor once ended) ------------------------
    for r in runs.values():
        if r["status"] in PARKED | TERMINAL and (r["lease_owner"] is not None or r["lease_expires_at"] is not None):
            v.add("I5", f"{r['status']} run holds a lease ({r['lease_owner']})", r["id"])

    for obs in meta.get("observed_waiting_with_lease") or []:  # the soak's live polls
        v.add("I5", f"observed {obs['status']} holding a lease ({obs['lease_owner']}) during the soak", obs["run"])

    # ---- I6 an ending never abandons an effect ----------------------------
    # The outcome of a sent call must be recorded: a result, or recorded as unknown — `interrupted` by a takeover,
    # or `uncertain` by the live worker whose request the cancel cut (its tool.call.failed says so, for that attempt).
    # Whatever ended the run: a run that ended with a side effect still `executing` (watermark committed, no
    # result, never labelled unknown) lost what happened to it, and nobody will be asked.
    recorded_unknown = {
        (e["payload"].get("invocation"), e["payload"].get("attempt"))
        for e in snapshot["events"]
        if e["type"] == "tool.call.failed" and e["payload"].get("outcome") == "uncertain"
    }
    for inv in invs.values():
        r = runs.get(inv["run_id"])
        if r and r["status"] == "CANCELLED" and inv["effect_sent_at"] is not None and not inv["has_result"]:
            if inv["status"] == "interrupted" or (
                inv["status"] == "uncertain" and (inv["id"], inv["attempt"]) in recorded_unknown
            ):
                continue
            v.add(
                "I6",
                f"cancelled run keeps watermarked invocation {inv['id']} ({inv['status']}) with no result",
                r["id"],
            )
        elif (
            r
            and r["status"] in TERMINAL
            and inv["effect_sent_at"] is not None
            and not inv["has_result"]
            and inv["status"] == "executing"
        ):
            reason = (r.get("failure") or {}).get("reason")
            v.add(
                "I6",
                f"run ended {r['status']}{':' + reason if reason else ''} with side-effect invocation {inv['id']} "
                f"still executing: sent (watermark committed), no result, its outcome never recorded as unknown",
                r["id"],
            )

    # ---- I7 approval single resolution -------------------------------------
    resolved = Counter()
    for e in snapshot["events"]:
        if e["type"] == "approval.resolved":
            resolved[e["payload"].get("approval")] += 1
    for a in approvals:
        n = resolved[a["id"]]
        if n > 1:
            v.add("I7", f"approval {a['id']} resolved {n} times", a["run_id"])
        if a["status"] in DECIDED and n != 1:
            v.add("I7", f"approval {a['id']} is {a['status']} with {n} approval.resolved events", a["run_id"])
    ok_by_approval = Counter(d["approval"] for d in decisions if d.get("ok"))
    for aid, n in ok_by_approval.items():
        if n > 1:
            v.add("I7", f"approval {aid} accepted {n} decisions")
    for d in decisions:
        if d.get("expect") == "refused" and d.get("ok"):
            v.add("I7", f"a {d.get('why')} decision on approval {d['approval']} was accepted", d.get("run"))
        if d.get("expect") == "ok" and d.get("ok") is False:
            # the operator's decision was refused for a reason nobody expected: its run is left waiting on it
            v.add(
                "I7",
                f"the operator's {d.get('decision')} of approval {d['approval']} ({d.get('kind')}) was refused: "
                f"{d.get('error')}",
                d.get("run"),
            )
    requeues = Counter()
    for e in snapshot["events"]:
        if e["type"] == "run.requeued" and e["payload"].get("reason") == "approval":
            requeues[e["run_id"]] += 1
    decided_by_run = Counter(
        a["run_id"]
        for a in approvals
        if a["status"] in ("approved", "confirmed") or (a["status"] == "rejected" and a["kind"] not in RERUN_KINDS)
    )
    for run_id, n in requeues.items():
        if n > decided_by_run[run_id]:
            v.add(
                "I7",
                f"run requeued {n} times by approvals but only {decided_by_run[run_id]} decisions could requeue it",
                run_id,
            )

    # ---- faults per window ---------------------------------------------------
    per_window = {k: Counter() for k in ("kill", "stop")}
    for f in kills + stops:
        if f.get("role") not in (None, "busy_worker", "idle_worker"):
            continue  # a window of a worker's run; other processes' deaths are counted by process type (deaths)
        held = f.get("held") or []
        if not held:
            per_window[f["kind"]]["idle"] += 1
        for h in held:
            per_window[f["kind"]][h["window"]] += 1
    by_window = {w: per_window["kill"][w] + per_window["stop"][w] for w in ALL_WINDOWS}

    # ---- I8 reconciliation exactness (enforced) -----------------------------
    # Every fault that froze a worker between the watermark and the result must
    # end in a recorded decision about that call: the takeover parks it on an
    # interrupted_side_effect approval (matched by invocation and attempt), or
    # the configured reconciler answers for it, or the operator had already
    # cancelled the run; a SIGSTOPped worker may also close the window itself by
    # recording the call's result before anyone took over. Anything else — the
    # takeover failing the run, never finding the call, no takeover after a
    # kill — is a violation. Conversely every such park must come from a
    # takeover that found the call in flight. The "equal" line is the check
    # that both accountings close with nothing unexplained.
    reconciler = bool(meta.get("reconciler"))
    cancel_at: dict[str, list[float]] = defaultdict(list)
    for f in faults:
        if f.get("kind") == "cancel" and f.get("run"):
            cancel_at[f["run"]].append(f.get("t") or 0.0)
    # a reconcile approval of a live call's uncertain outcome belongs to the uncertain accounting below
    live_unknown = {(o["invocation"], o["attempt"]) for o in uncertain_outcomes}
    interrupted = [
        a
        for a in approvals
        if a["kind"] in FAULT_PARK_KINDS
        and not (a["kind"] == "reconcile" and (a["invocation_id"], a.get("attempt")) in live_unknown)
    ]
    actual = {(a["invocation_id"], a.get("attempt")): a for a in interrupted}
    expected_parks: dict[tuple, dict] = {}
    explained, unexplained = [], []
    wm_faults = [(f, h) for f in kills + stops for h in (f.get("held") or []) if h["window"] == "watermark_to_result"]

    def outcome_recorded(inv_id) -> bool:
        inv = invs.get(inv_id)
        return bool(inv and inv["has_result"])

    for f, h in wm_faults:
        key = (h["invocation"], h["attempt"])
        t = next((t for t in takeovers.get(h["run"], []) if t["previous_epoch"] == h["epoch"]), None)
        item = {
            "fault": f["id"],
            "kind": f["kind"],
            "run": h["run"],
            "invocation": h["invocation"],
            "attempt": h["attempt"],
        }
        if t is None or h["invocation"] not in t["unknown"]:
            if f["kind"] == "stop" and outcome_recorded(h["invocation"]):
                explained.append(
                    {
                        **item,
                        "decision": "result",
                        "why": "the stopped worker resumed and recorded the call's result itself"
                        + (" before the takeover" if t else " (no takeover)"),
                    }
                )
            elif t is None:
                unexplained.append(
                    {
                        **item,
                        "why": f"{'killed' if f['kind'] == 'kill' else 'stopped'} in the watermark window, "
                        "never taken over from that epoch and no result recorded",
                    }
                )
            else:
                unexplained.append(
                    {
                        **item,
                        "why": "the takeover did not find the frozen worker's call in flight and no result is recorded",
                    }
                )
            continue
        d, payload = t["decision"], t["decision_payload"] or {}
        reason = (payload.get("failure") or {}).get("reason") if d == "run.failed" else None
        rj = judged.get(("takeover", h["run"], t.get("decided_by_epoch", t["epoch"])))
        if rj is not None:  # its tool has a reconciler: the decision must be the one its answer calls for
            if not rj["ok"]:
                unexplained.append({**item, "why": rj["why"], "reported": True})
            elif rj["answer"] == "waiting":
                expected_parks[key] = item  # on a `reconcile` approval of this attempt
            else:
                explained.append({**item, "decision": d, "why": rj["why"]})
            continue
        if d == "run.waiting_for_approval":
            expected_parks[key] = item
        elif reconciler and (d in ("run.requeued", "run.completed") or reason == "reconcile_conflict"):
            explained.append(
                {**item, "decision": d, "why": f"the reconciler answered ({d}{': ' + reason if reason else ''})"}
            )
        elif (
            d == "run.cancelled"
            and cancel_at.get(h["run"])
            and (runs[h["run"]].get("cancel_requested_at") or float("inf")) <= t["at"]
        ):
            explained.append({**item, "decision": d, "why": "the operator had cancelled the run before the takeover"})
        else:
            unexplained.append(
                {
                    **item,
                    "why": f"the takeover found the unknown effect and decided {d}"
                    + (f" ({reason})" if reason else "")
                    + ", not a park or a reconciler's answer",
                }
            )
    if not reconciler:
        for run_id, lst in takeovers.items():  # seed 000's table, independent of injected faults
            for t in lst:
                if ("takeover", run_id, t.get("decided_by_epoch", t["epoch"])) in judged:
                    continue  # a reconciled call: _judge_reconciled holds the decision to its reconciler's answer
                if t["unknown"] and t["decision"] in ("run.requeued", "run.completed"):
                    v.add(
                        "I8",
                        f"takeover at epoch {t['epoch']} found unknown effects {t['unknown']} and decided "
                        f"{t['decision']}",
                        run_id,
                    )
    extra_parks, parks_unexplained = [], []
    for key, a in actual.items():
        if key in expected_parks:
            continue
        run_id = a["run_id"]
        t = next(
            (
                t
                for t in takeovers.get(run_id, [])
                if a["invocation_id"] in t["unknown"] and t["decision"] == "run.waiting_for_approval"
            ),
            None,
        )
        item = {"approval": a["id"], "run": run_id, "invocation": a["invocation_id"], "attempt": a.get("attempt")}
        if t is None:
            parks_unexplained.append({**item, "cause": "no takeover found the call in flight and parked it"})
            continue
        same_epoch = [
            f
            for f in kills + stops
            for h in (f.get("held") or [])
            if h["run"] == run_id and h["epoch"] == t["previous_epoch"]
        ]
        fenced = [
            e for e in events_by_run[run_id] if e["type"] == "run.fenced" and e["lease_epoch"] == t["previous_epoch"]
        ]
        if any(f["kind"] == "stop" for f in same_epoch):
            cause = (
                "a SIGSTOPped zombie wrote its watermark after SIGCONT, self-fenced before sending, then lost its lease"
            )
        elif same_epoch:
            cause = (
                f"fault {[f['id'] for f in same_epoch]} at this epoch was classified "
                f"{[h['window'] for f in same_epoch for h in f['held']]}"
            )
        elif fenced:
            cause = "the worker self-fenced (no injected fault at this epoch: missed heartbeats under load)"
        else:
            cause = (
                "the lease expired with no injected fault at this epoch (missed heartbeats under load); the "
                "takeover found the call in flight"
            )
        extra_parks.append({**item, "cause": cause})
    matched = sum(1 for k in expected_parks if k in actual)
    missing = [v_ for k, v_ in expected_parks.items() if k not in actual]
    i8 = {
        "interrupted_side_effect_approvals": len(interrupted),
        "faults_in_watermark_window": len(wm_faults),
        "faults_in_watermark_window_kill": sum(1 for f, _ in wm_faults if f["kind"] == "kill"),
        "faults_in_watermark_window_stop": sum(1 for f, _ in wm_faults if f["kind"] == "stop"),
        # faults = parked + decided otherwise + closed by their own result + unexplained (must be 0);
        # parks  = matched to a fault + a takeover without an injected fault + unexplained (must be 0)
        "equal": not unexplained and not missing and not parks_unexplained,
        "accounting": {
            "faults": len(wm_faults),
            "parked": matched,
            "park_missing": len(missing),
            "decided_otherwise": sum(1 for x in explained if x["decision"] != "result"),
            "closed_by_own_result": sum(1 for x in explained if x["decision"] == "result"),
            "unexplained": len(unexplained),
            "parks": len(interrupted),
            "parks_matched": matched,
            "parks_after_unfaulted_takeover": len(extra_parks),
            "parks_unexplained": len(parks_unexplained),
        },
        "expected_parks": len(expected_parks),
        "matched": matched,
        "expected_parks_missing": missing,
        "faults_without_park_explained": explained,
        "faults_without_park_unexplained": unexplained,
        "parks_without_watermark_fault": extra_parks,
        "parks_unexplained": parks_unexplained,
    }
    for item in missing:
        v.add(
            "I8",
            f"takeover parked invocation {item['invocation']} but no interrupted_side_effect approval matches attempt "
            f"{item['attempt']}",
            item["run"],
        )
    for item in unexplained:
        if item.get("reported"):
            continue  # _judge_reconciled said so
        v.add(
            "I8",
            f"fault {item['fault']} ({item['kind']}) in the watermark window: {item['why']}",
            item["run"],
            fault=item["fault"],
        )
    for item in parks_unexplained:
        v.add("I8", f"approval {item['approval']} parks invocation {item['invocation']}: {item['cause']}", item["run"])

    # ---- unknown outcomes of live calls (issue 11), like faults in the watermark window ----
    uncertain = _check_uncertain(uncertain_outcomes, runs, inv_by_key, approvals, faults, sink, reconciler, judged, v)

    # ---- takeover latency -------------------------------------------------
    lat_kill, lat_stop, no_takeover = [], [], []
    for f in kills:
        for h in f.get("held") or []:
            t = next((t for t in takeovers.get(h["run"], []) if t["previous_epoch"] == h["epoch"]), None)
            if t is None:
                no_takeover.append({"fault": f["id"], "run": h["run"], "epoch": h["epoch"]})
                continue
            lat_kill.append(t["at"] - f["t_freeze"])
    for f in stops:
        for h in f.get("held") or []:
            t = next((t for t in takeovers.get(h["run"], []) if t["previous_epoch"] == h["epoch"]), None)
            if t is not None and t["at"] <= f.get("t_cont", float("inf")):
                lat_stop.append(t["at"] - f["t_freeze"])
    for item in no_takeover:
        r = runs.get(item["run"])
        v.add(
            "I1",
            f"worker killed holding epoch {item['epoch']} but no takeover from that epoch (run "
            f"{r['status'] if r else '?'})",
            item["run"],
        )

    # ---- statuses, approvals, throughput -----------------------------------
    statuses = Counter(r["status"] for r in runs.values())
    reasons = Counter((r.get("failure") or {}).get("reason") for r in runs.values() if r["status"] == "FAILED")
    term_at = {}
    for run_id, evs in events_by_run.items():
        for e in evs:
            if e["type"] in ("run.completed", "run.failed", "run.cancelled"):
                term_at[run_id] = e["occurred_at"]
    t0 = meta.get("t_first_submit")
    throughput = None
    if term_at and t0:
        span = max(term_at.values()) - t0
        throughput = {
            "runs_terminal": len(term_at),
            "span_s": round(span, 1),
            "runs_per_min": round(len(term_at) / span * 60, 1) if span > 0 else None,
        }
    submitted = {r["id"]: r.get("submitted_at") for r in snapshot["runs"]}
    run_latency = [term_at[r] - submitted[r] for r in term_at if submitted.get(r)]
    approvals_summary = {
        "by_kind_status": {
            f"{k}:{s}": n for (k, s), n in sorted(Counter((a["kind"], a["status"]) for a in approvals).items())
        },
        "decisions_ok": sum(1 for d in decisions if d.get("ok")),
        "decisions_refused_as_expected": sum(1 for d in decisions if d.get("expect") == "refused" and not d.get("ok")),
        "decisions_failed_unexpectedly": [d for d in decisions if d.get("expect") == "ok" and not d.get("ok")],
        "decisions_skipped_not_pending": sum(1 for d in decisions if d.get("expect") == "skip"),
    }
    sends = {
        "total": len(sink),
        "keys": len(sends_by_key),
        "authorized_resends": dup_sends,
        **effects,
        "by_attempt": dict(sorted(Counter(str(s.get("attempt")) for s in sink).items())),
    }
    return {
        "violations": list(v),
        "violations_by_invariant": dict(Counter(x["invariant"] for x in v)),
        "runs": len(runs),
        "statuses": dict(statuses),
        "failure_reasons": dict(reasons),
        "outcomes": outcomes,
        "fencing": fencing,
        "faults": {
            "kills": len(kills),
            "stops": len(stops),
            "planned": sum(1 for f in kills + stops if f.get("source") == "planned"),
            "random": sum(1 for f in kills + stops if f.get("source") == "random"),
            "kill_by_window": {w: per_window["kill"][w] for w in ALL_WINDOWS},
            "stop_by_window": {w: per_window["stop"][w] for w in ALL_WINDOWS},
            "by_window": by_window,
            "uncertain_by_window": uncertain["by_window"],
            "cancels": sum(1 for f in faults if f.get("kind") == "cancel"),
            "aborted_freezes": sum(1 for f in faults if f.get("kind") == "aborted"),
        },
        "windows_hit": {w: by_window[w] > 0 for w in WINDOWS},
        "kill_windows_hit": {w: per_window["kill"][w] > 0 for w in WINDOWS},
        "i8": i8,
        "uncertain": uncertain,
        "reconcilers": reconcilers,
        "takeover_latency_s": {
            "kill": _dist(lat_kill),
            "stop_during_stop": _dist(lat_stop),
            "kills_without_takeover": no_takeover,
        },
        "takeovers": sum(len(x) for x in takeovers.values()),
        "deaths": _deaths(faults, meta),
        "coverage": _coverage(faults, meta),
        "sink_restarts": _sink_restarts(faults, sink, uncertain_outcomes, events_by_run, inv_by_key, approvals),
        "redis_restarts": [
            {k: f.get(k) for k in ("at", "t", "t_ready", "connected_clients_before", "commands_before")}
            for f in faults
            if f.get("kind") == "redis_restart"
        ],
        "recovery_s": _recovery(faults, events_by_run, meta, LEASE_OF(meta)),
        "submits": _submits(meta),
        "logs_judged": logs_judged,
        "approvals": approvals_summary,
        "sends": sends,
        "throughput": throughput,
        "run_latency_s": _dist(run_latency),
    }


# -- process deaths (issue 14: the soak kills without carve-outs) ---------------------------

DEATH_KINDS = ("kill", "terminate", "pg_restart", "redis_restart")
PROCESS_TYPES = (
    "busy_worker",
    "idle_worker",
    "pusher",
    "monitor",
    "sentinel",
    "qcluster_main",
    "run_maintenance",
    "web_node",
    "pg_backend",
    "postgres_restart",
    "redis_restart",
)
DB_FAULT_KINDS = ("terminate", "pg_restart")
# what a lost database connection raises; anything else in a traceback is a failure no fault explains
DB_LOST = ("OperationalError", "InterfaceError", "AdminShutdown")
DB_LOST_TEXT = (
    "terminating connection",
    "server closed the connection",
    "connection is lost",
    "connection failed",
    "connection refused",
    "the database system is",
    "consuming input failed",
    "connection already closed",
    "the connection is closed",
    "sending query failed",
    "ssl syscall",
    "eof detected",
    "could not receive data",
    "no connection to the server",
    "connection has been closed",
    "cannot connect",
    "server conn crashed",
    "connection timeout expired",
    "connection to server",
)
TERMINATE_REACH_S = 600.0  # a terminated idle connection is found at its next use (a pooled one may sit idle a while)
RESTART_REACH_S = 120.0
SENTINEL_START_FAILED = "failed to start: sentinel exited with code"
SENTINEL_START_S = 30.0  # how long before the main's error its sentinel may have died starting


def LEASE_OF(meta: dict) -> float:
    return float(meta.get("lease_seconds") or 2.0)


def _role(f: dict) -> str | None:
    if f.get("kind") not in DEATH_KINDS:
        return None
    if f.get("role"):
        return f["role"]
    return "busy_worker" if f.get("held") else "idle_worker"  # reports from before roles: only workers died


def _deaths(faults: list[dict], meta: dict) -> dict:
    """Every process death the soak injected, by process type and by the
    window it landed in (a worker's: its run's side-effect window, frozen;
    a node process's: the worst window its node's runs were in; a web node's:
    whether a submit was in flight to it; a backend's: its state), and what
    the supervisor restarted (an exit of a supervised process, by role and
    exit status)."""
    by_type: dict[str, Counter] = {t: Counter() for t in PROCESS_TYPES}
    sources = Counter()
    for f in faults:
        role = _role(f)
        if role is None:
            continue
        by_type.setdefault(role, Counter())[f.get("window") or "-"] += 1
        sources[f.get("source") or "random"] += 1
    total = sum(sum(c.values()) for c in by_type.values())
    sigkills = sum(1 for f in faults if f.get("kind") == "kill")
    exits = meta.get("supervisor") or []
    restarts = Counter(e["role"] for e in exits)
    rcs: dict[str, Counter] = defaultdict(Counter)
    for e in exits:
        rcs[e["role"]][str(e["rc"])] += 1
    return {
        "total": total,
        "sigkill": sigkills,
        "pg_backends_terminated": sum(1 for f in faults if f.get("kind") == "terminate"),
        "pg_restarts": sum(1 for f in faults if f.get("kind") == "pg_restart"),
        "redis_restarts": sum(1 for f in faults if f.get("kind") == "redis_restart"),
        "by_type": {t: sum(c.values()) for t, c in by_type.items()},
        "by_type_window": {t: dict(sorted(c.items())) for t, c in by_type.items()},
        "by_source": dict(sources),
        "types_hit": {t: sum(c.values()) > 0 for t, c in by_type.items()},
        "supervisor_restarts": dict(restarts),
        "supervisor_exit_status": {k: dict(v) for k, v in rcs.items()},
    }


YOUNG_S = 20.0  # "a node's first 20 s" (issue 33 item 6): the soak once spared what had started less long ago


def _coverage(faults: list[dict], meta: dict) -> dict:
    """Where the faults reached that the soak once spared (issue 33 item 6), counted so that a window no fault
    reached shows: stops by what they froze (a worker holding a lease, an idle worker, a whole node) and by
    window; kills of a process within YOUNG_S of its start (its node's generation for the node's processes);
    deaths and stops after the last submit (the drain)."""
    stops = [f for f in faults if f.get("kind") == "stop"]
    by_target: Counter = Counter(f.get("role") or ("busy_worker" if f.get("held") else "idle_worker") for f in stops)
    node_windows: Counter = Counter(f.get("window") or "idle" for f in stops if f.get("role") == "node")
    young: dict[str, Counter] = defaultdict(Counter)
    for f in faults:
        if f.get("kind") == "kill" and f.get("uptime") is not None:
            young[_role(f) or "?"]["young" if f["uptime"] < YOUNG_S else "older"] += 1
    t_drain = meta.get("t_drain")
    drain = [f for f in faults if t_drain is not None and (f.get("t") or 0) >= t_drain]
    return {
        "stops_by_target": {t: by_target.get(t, 0) for t in ("busy_worker", "idle_worker", "node")},
        "node_stops_by_window": dict(sorted(node_windows.items())),
        "node_stop_workers_held": sum(len(f.get("held") or []) for f in stops if f.get("role") == "node"),
        "kills_within_first_s": YOUNG_S,
        "kills_young_by_type": {t: c["young"] for t, c in sorted(young.items()) if c["young"]},
        "kills_young": sum(c["young"] for c in young.values()),
        "kills_with_uptime": sum(sum(c.values()) for c in young.values()),
        "drain": {
            "started_at": t_drain,
            "deaths": sum(1 for f in drain if f.get("kind") in DEATH_KINDS),
            "stops": sum(1 for f in drain if f.get("kind") == "stop"),
            "deaths_by_type": dict(Counter(_role(f) for f in drain if f.get("kind") in DEATH_KINDS)),
        },
    }


def _sink_restarts(
    faults: list[dict], sink: list[dict], outcomes: list[dict], events_by_run: dict, inv_by_key: dict, approvals
) -> dict:
    """The effect sink's restarts (SIGKILL, started again on its port) and what they cut: the POSTs in flight
    when it died — the one it held for the restart, and any whose late answer (`delay:S`) was still owed —
    and how each ended: `uncertain` (the connection reset: an unknown outcome, parked or reconciled like any
    other), overtaken by a process fault while its worker waited (interrupted, I8), or a POST the sink never
    logged whose call ended uncertain at that moment (cut before its record was written); and the calls
    refused while it was down (`connection_failed`: nothing sent, a definite failure the model sees)."""
    restarts = [f for f in faults if f.get("kind") == "sink_restart"]
    by_key_attempt = {(o["invocation"], o["attempt"]): o for o in outcomes}
    invs = {i["id"]: i for i in inv_by_key.values()}
    ever_logged = {(rec.get("key"), str(rec.get("attempt"))) for rec in sink}
    interrupted = {(a["invocation_id"], a.get("attempt")) for a in approvals if a["kind"] in FAULT_PARK_KINDS}
    failures = []
    for evs in events_by_run.values():
        for e in evs:
            p = e["payload"]
            if e["type"] == "tool.call.failed" and p.get("outcome") != "uncertain" and isinstance(p.get("error"), dict):
                failures.append((e["occurred_at"], p["error"].get("error")))
    out = []
    prev_kill = float("-inf")
    for f in sorted(restarts, key=lambda f: f["t"]):
        t_kill, t_ready = f["t"], f.get("t_ready", f["t"])
        cut, uncertain, overtaken = [], 0, 0
        logged = set()
        for rec in sink:
            t = (rec.get("t_ns") or 0) / 1e9
            if t > t_kill or t <= prev_kill:
                continue  # arrived after this kill, or before the last one (which cut it)
            behaviour = rec.get("behaviour") or ""
            pending = rec.get("held_for_restart") or (
                behaviour.startswith("delay:") and t + float(behaviour.split(":", 1)[1]) > t_kill
            )
            if not pending:
                continue
            inv = inv_by_key.get(rec.get("key"))
            attempt = int(rec["attempt"]) if str(rec.get("attempt") or "").isdigit() else rec.get("attempt")
            key = (inv["id"] if inv else None, attempt)
            logged.add(key)
            o = by_key_attempt.get(key)
            ended = (
                f"uncertain ({o['cause']})"
                if o is not None and o["at"] >= t_kill - 0.01
                else "answer already given up on"
                if o is not None
                else "interrupted (a process fault overtook it)"
                if key in interrupted
                else "no outcome recorded"
            )
            uncertain += ended.startswith("uncertain")
            overtaken += ended.startswith("interrupted")
            cut.append(
                {
                    "key": rec.get("key"),
                    "attempt": rec.get("attempt"),
                    "held": bool(rec.get("held_for_restart")),
                    "ended": ended,
                }
            )
        unlogged = [
            o
            for o in outcomes
            if o["cause"] == "connection_lost"
            and t_kill <= o["at"] <= t_ready + 1.0
            and ((invs.get(o["invocation"]) or {}).get("idempotency_key"), str(o["attempt"])) not in ever_logged
        ]
        refused = sum(1 for t, code in failures if code == "connection_failed" and t_kill <= t <= t_ready + 1.0)
        out.append(
            {
                "at": f.get("at"),
                "down_s": round(t_ready - t_kill, 3),
                "held_a_post": f.get("held_post") is not None,
                "in_flight": len(cut),
                "reset_ended_uncertain": uncertain,
                "reset_overtaken_by_a_process_fault": overtaken,
                "cut_before_logged_ended_uncertain": len(unlogged),
                "refused_while_down": refused,
                "cut": cut,
            }
        )
        prev_kill = t_kill
    return {
        "restarts": len(restarts),
        "in_flight": sum(x["in_flight"] for x in out),
        "resets_ended_uncertain": sum(x["reset_ended_uncertain"] + x["cut_before_logged_ended_uncertain"] for x in out),
        "resets_overtaken": sum(x["reset_overtaken_by_a_process_fault"] for x in out),
        "refused_while_down": sum(x["refused_while_down"] for x in out),
        "by_restart": out,
    }


def _recovery(faults: list[dict], events_by_run: dict, meta: dict, lease: float) -> dict:
    """Figures, never assertions: how long the deployment took to claim again
    after each death (kill -> the next `run.claimed` anywhere; for a node's
    process -> the next claim by a worker of that node, whatever its
    generation), a killed web node's next answered submit, the database
    restart's downtime, and how long queued runs waited for a claim (created
    or requeued -> claimed; the issue's bound is lease + 10 s)."""

    nodes = {int(k): v for k, v in (meta.get("worker_nodes") or {}).items()}
    claims: list[tuple[float, int | None]] = []
    waits: list[float] = []
    for evs in events_by_run.values():
        queued_at = None
        for e in evs:
            if e["type"] in ("run.created", "run.requeued"):
                queued_at = e["occurred_at"]
            elif e["type"] == "run.claimed":
                owner = (e["payload"] or {}).get("lease_owner") or ""
                parts = owner.split(":")
                pid = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
                claims.append((e["occurred_at"], nodes.get(pid) if pid is not None else None))
                if queued_at is not None:
                    waits.append(e["occurred_at"] - queued_at)
                queued_at = None
    claims.sort(key=lambda c: c[0])
    times = [c[0] for c in claims]
    by_node: dict[int | None, list[float]] = defaultdict(list)
    for tc, n in claims:
        by_node[n].append(tc)
    anywhere: dict[str, list[float]] = defaultdict(list)
    same_node: dict[str, list[float]] = defaultdict(list)
    for f in faults:
        role = _role(f)
        if role is None or f.get("t") is None:
            continue
        t0 = f.get("t_ready", f["t"]) if role in ("postgres_restart", "redis_restart") else f["t"]
        i = bisect.bisect_right(times, t0)
        if i < len(times):
            anywhere[role].append(times[i] - t0)
        node = f.get("node")
        if node is not None and role not in ("web_node",):
            node_times = by_node.get(node, [])
            j = bisect.bisect_right(node_times, t0)
            if j < len(node_times):
                same_node[role].append(node_times[j] - t0)
    web_answer: list[float] = []
    answers = sorted(
        (a["t"] + a["s"], a["node"])
        for w in meta.get("web_submits") or []
        for a in w["attempts"]
        if a["status"] in (200, 201)
    )
    for f in faults:
        if _role(f) == "web_node" and f.get("node") is not None:
            nxt = next((t for t, n in answers if n == f["node"] and t > f["t"]), None)
            if nxt is not None:
                web_answer.append(nxt - f["t"])
    restarts = meta.get("pg_restarts") or []
    return {
        "next_claim_anywhere": {k: _dist(v) for k, v in sorted(anywhere.items())},
        "next_claim_same_node": {k: _dist(v) for k, v in sorted(same_node.items())},
        "web_node_next_answer": _dist(web_answer),
        "postgres_restart_downtime": [round(r["t_ready"] - r["t_stop"], 3) for r in restarts],
        "queue_wait": {**_dist(waits), "over_lease_plus_10": sum(1 for w in waits if w > lease + 10)},
    }


def _submits(meta: dict) -> dict:
    web = meta.get("web_submits") or []
    return {
        "web": len(web),
        "web_answered_first_try": sum(1 for w in web if len(w["attempts"]) == 1 and w.get("run")),
        "web_retried": sum(1 for w in web if len(w["attempts"]) > 1),
        "web_attempts_unanswered": sum(1 for w in web for a in w["attempts"] if a["status"] is None),
        "web_attempts_5xx": sum(1 for w in web for a in w["attempts"] if (a["status"] or 0) >= 500),
        "web_replays_answered_200": sum(1 for w in web if w.get("run") and not w.get("created")),
        "service": len(meta.get("service_submits") or []),
        "service_retried": sum(1 for s in meta.get("service_submits") or [] if s["attempts"] > 1),
        "refused": len(meta.get("submit_errors") or []),
    }


REDIS_REACH_S = 60.0  # a pooled Redis connection cut by the restart is found at its next use
REDIS_LOST = ("ConnectionError", "ConnectionRefusedError", "ConnectionResetError", "TimeoutError", "BrokenPipeError")
REDIS_LOST_TEXT = (
    "connecting to",
    "connection refused",
    "closed by server",
    "connection reset",
    "timeout",
    "broken pipe",
)


def _redis_lost(exc: str) -> bool:
    name, _, text = exc.partition(": ")
    return name.rsplit(".", 1)[-1] in REDIS_LOST and any(m in text.lower() for m in REDIS_LOST_TEXT)


def _db_lost(exc: str) -> bool:
    name, _, text = exc.partition(": ")
    return name.rsplit(".", 1)[-1] in DB_LOST and any(m in text.lower() for m in DB_LOST_TEXT)


def _judge_logs(process_logs: dict, faults: list[dict], v: _Violations) -> dict:
    """A traceback in a process's log is a failure unless a fault of the soak
    explains it: every exception of its chain is a lost database connection
    (OperationalError / InterfaceError / AdminShutdown with a connection-loss
    message) and a database fault reached that process before it — the
    PostgreSQL restart (within RESTART_REACH_S of the server being ready
    again) or `pg_terminate_backend` of a backend with that process's
    application_name (within TERMINATE_REACH_S) — or every exception of its
    chain is a lost Redis connection and the Redis restart reached it
    (within REDIS_REACH_S of Redis being up again). Kills and stops never
    make a process raise, save one: a qcluster main process whose sentinel
    died while the node started says so ("failed to start"), which a kill of
    one of the node's processes (or a database fault) just before explains.
    Logs of reports made before tracebacks were itemised fall back to the
    counts: any is a violation."""
    restarts = [
        (f["t"] - 1.0, f.get("t_ready", f["t"]) + RESTART_REACH_S) for f in faults if f.get("kind") == "pg_restart"
    ]
    terminated: dict[str, list[float]] = defaultdict(list)
    for f in faults:
        if f.get("kind") == "terminate":
            terminated[f.get("application_name")].append(f["t"])
    redis_restarts = [
        (f["t"] - 1.0, f.get("t_ready", f["t"]) + REDIS_REACH_S) for f in faults if f.get("kind") == "redis_restart"
    ]
    killed: dict[str, list[tuple[float, str]]] = defaultdict(list)  # a node's log name -> its processes' SIGKILLs
    for f in faults:
        if f.get("kind") == "kill" and f.get("node") is not None and _role(f) in NODE_ROLES:
            killed[f.get("supervised") or f"qcluster-{f['node']}"].append((f["t"], _role(f) or "?"))
    out = {"tracebacks": 0, "explained_by_db_fault": 0, "unexplained": 0, "by_process": {}}
    for name, counts in sorted(process_logs.items()):
        tbs = counts.get("traceback_list")
        if tbs is None:  # the older summary: counts only
            n, t = counts.get("unhandled_run_errors", 0), counts.get("tracebacks", 0)
            if n or t:
                v.add(
                    "I1",
                    f"{name}'s log shows {n} unhandled run error(s) and {t} traceback(s) (no fault of the soak causes "
                    f"an exception)",
                )
            continue
        app = counts.get("application_name")
        mine = {"tracebacks": len(tbs), "explained_by_db_fault": 0, "unexplained": 0, "causes": Counter()}
        last_explained: tuple[float, str] | None = None
        for tb in tbs:
            t = tb.get("t")
            # when it was printed: after the record before it, before the next one (a child process's
            # traceback, printed by multiprocessing, has no record of its own)
            t_hi = tb.get("t_next") or t
            excs = tb.get("exceptions") or []
            cause = None
            if excs and t is not None and all(_db_lost(e) for e in excs):
                if any(a <= t_hi and t <= b for a, b in restarts):
                    cause = "the PostgreSQL restart"
                elif any(tf - 1.0 <= t_hi and t <= tf + TERMINATE_REACH_S for tf in terminated.get(app, [])):
                    cause = f"pg_terminate_backend of a {app} backend"
            elif excs and t is not None and all(_redis_lost(e) for e in excs):
                if any(a <= t_hi and t <= b for a, b in redis_restarts):
                    cause = "the Redis restart"
            elif len(excs) == 1 and t is not None and SENTINEL_START_FAILED in excs[0]:
                # qcluster's main process raises this when its sentinel died while
                # starting: a consequence, explained by what killed the sentinel —
                # its own traceback just before (a lost connection), or a database
                # fault that reached this node while it started
                if last_explained and t - SENTINEL_START_S <= last_explained[0] <= t:
                    cause = f"its sentinel died starting ({last_explained[1]})"
                elif any(t - SENTINEL_START_S <= b and a <= t for a, b in restarts):
                    cause = "its sentinel died starting (the PostgreSQL restart)"
                elif any(t - SENTINEL_START_S <= tf <= t for tf in terminated.get(app, [])):
                    cause = f"its sentinel died starting (pg_terminate_backend of a {app} backend)"
                elif any(t - SENTINEL_START_S <= tf <= t for tf, _ in killed.get(name, [])):
                    role = next(r for tf, r in reversed(killed[name]) if t - SENTINEL_START_S <= tf <= t)
                    cause = f"its sentinel died starting (a SIGKILL of the node's {role} while it started)"
            if cause and t is not None:
                last_explained = (t, cause)
            if cause:
                mine["explained_by_db_fault"] += 1
                mine["causes"][cause] += 1
            else:
                mine["unexplained"] += 1
                v.add(
                    "I1",
                    f"{name}'s log: a traceback no fault of the soak explains: {tb.get('record')!r} "
                    f"{excs[-1] if excs else '(no exception line)'}",
                )
        mine["causes"] = dict(mine["causes"])
        out["by_process"][name] = mine
        for k in ("tracebacks", "explained_by_db_fault", "unexplained"):
            out[k] += mine[k]
    return out


def parse_jsonl(text: str) -> list[dict]:
    """One dict per line. A line cut short — its writer SIGKILLed mid-write, e.g. the sink at its restart —
    is skipped: it was never a whole record."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


ARTIFACTS = ("snapshot.json", "sink.jsonl", "faults.jsonl", "decisions.jsonl", "reconcile.jsonl")


def load_artifacts(folder: Path) -> tuple[dict, list, list, list, list]:
    """(snapshot, sink, faults, decisions, reconciles): check()'s arguments, from a soak's folder."""

    def jsonl(name):
        p = folder / name
        return parse_jsonl(p.read_text()) if p.exists() else []

    return (
        json.loads((folder / "snapshot.json").read_text()),
        jsonl("sink.jsonl"),
        jsonl("faults.jsonl"),
        jsonl("decisions.jsonl"),
        jsonl("reconcile.jsonl"),
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m tests.chaos.checker ARTIFACT_DIR", file=sys.stderr)
        return 2
    report = check(*load_artifacts(Path(argv[0])))
    print(json.dumps(report, indent=2, default=str))
    return 1 if report["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
