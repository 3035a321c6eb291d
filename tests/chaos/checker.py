"""The chaos soak's oracle: a pure function over a database snapshot, the
effect sink's log and the fault log (RELIABILITY §2, invariants I1–I8).

Nothing here touches Django, the database or the clock: `check(...)` takes
plain dicts and lists (as `soak.py` dumps them to JSON) and returns a report,
so a soak's artifacts can be re-checked offline:

    python -m tests.chaos.checker ARTIFACT_DIR        # snapshot.json, sink.jsonl, faults.jsonl, decisions.jsonl

Inputs
------
snapshot: {"runs", "sessions", "events", "invocations", "model_calls",
           "checkpoints", "approvals", "meta"} — rows as dicts, UUIDs as
           strings, timestamps as POSIX seconds (floats).
sink:     one dict per POST the sink received, in arrival order:
           {"key": Idempotency-Key, "attempt": X-Agentrt-Attempt, ...}.
faults:   one dict per fault the soak injected (`kind` kill | stop; others
           such as `cancel` or `aborted` are context). A kill/stop names the
           runs the worker held when it was frozen, each with the window the
           database showed at that moment:
           {"run", "epoch", "window", "invocation", "attempt"}.
decisions: the soak's operator log: one dict per approval_decide call
           {"approval", "run", "decision", "ok", "expect": "ok"|"refused"}.

Windows (of the in-flight side-effect call of the run the worker held):
`before_watermark` (an authorized side-effect invocation whose watermark is
not committed), `watermark_to_result` (status `executing`: watermark
committed, no result), `after_result` (the run's latest side-effect result is
committed and no other one is in flight), `no_effect` (no side-effect call
yet: model or read-only phases), `idle` (the worker held no lease).
"""
from __future__ import annotations

import json
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

WINDOWS = ("before_watermark", "watermark_to_result", "after_result")
ALL_WINDOWS = WINDOWS + ("no_effect", "idle")
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED"}
PARKED = {"WAITING_FOR_APPROVAL", "WAITING_FOR_USER"}
RERUN_KINDS = {"interrupted_side_effect", "reconcile"}
DECISION_TYPES = {"run.waiting_for_approval", "run.requeued", "run.failed", "run.cancelled", "run.completed", "run.fenced"}


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
            unknown, decision, decision_payload = [], None, None
            for f in evs[i + 1:]:
                if f["type"] == "step.interrupted" and f["lease_epoch"] == new_epoch:
                    p = f["payload"]
                    if p.get("phase") == "executing" and p.get("read_only") is False:
                        unknown.append(p.get("invocation"))
                    continue
                if f["type"] in DECISION_TYPES and f["lease_epoch"] == new_epoch:
                    decision, decision_payload = f["type"], f["payload"]
                    break
                if f["type"] == "lease.taken_over":
                    break
            lst.append({
                "sequence": e["sequence"], "at": e["occurred_at"], "previous_epoch": e["payload"].get("previous_epoch"),
                "epoch": new_epoch, "via": e["payload"].get("via"), "previous_owner": e["payload"].get("previous_owner"),
                "unknown": unknown, "decision": decision, "decision_payload": decision_payload,
            })
        if lst:
            out[run_id] = lst
    return out


def check(snapshot: dict, sink: list[dict], faults: list[dict], decisions: list[dict] | None = None) -> dict:
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

    # ---- I1 no lost run --------------------------------------------------
    expected = meta.get("runs_submitted")
    if expected is not None and expected != len(runs):
        v.add("I1", f"{expected} runs submitted but {len(runs)} in the database")
    pending_by_run = Counter(a["run_id"] for a in approvals if a["status"] == "pending")
    t_end = meta.get("t_end") or 0
    doorbells: dict[str, list[str]] = defaultdict(list)
    for d in snapshot.get("doorbells") or []:  # django-q2 ORM broker rows left at the end
        lock = d.get("lock")
        state = "waiting in the queue" if lock is None or lock <= t_end else f"dequeued by a pusher, locked until +{lock - t_end:.0f}s"
        doorbells[d.get("run")].append(state)
    for r in runs.values():
        if r["status"] in TERMINAL:
            continue
        if r["status"] == "WAITING_FOR_APPROVAL" and pending_by_run[r["id"]]:
            continue  # parked, waiting for an operator
        if r["status"] == "WAITING_FOR_USER":
            continue
        v.add("I1", f"run is {r['status']} at the end (lease_owner={r['lease_owner']}, epoch={r['lease_epoch']}; "
                    f"drive_run doorbells: {doorbells.get(r['id']) or 'none'})", r["id"])

    # ---- I2 no unapproved duplicate effect --------------------------------
    approved_reruns = Counter(a["invocation_id"] for a in approvals if a["kind"] in RERUN_KINDS and a["status"] == "approved")
    sends_by_key: dict[str, list[dict]] = defaultdict(list)
    for s in sink:
        sends_by_key[s.get("key")].append(s)
    dup_sends = 0
    for key, sends in sends_by_key.items():
        inv = inv_by_key.get(key)
        if inv is None:
            v.add("I2", f"{len(sends)} send(s) with Idempotency-Key {key!r} that names no invocation")
            continue
        allowed = 1 + approved_reruns[inv["id"]]
        if len(sends) > 1:
            dup_sends += len(sends) - 1
        if len(sends) > allowed:
            v.add("I2", f"invocation {inv['id']} sent {len(sends)} times, authorized {allowed}", inv["run_id"],
                  attempts=[s.get("attempt") for s in sends])
        per_attempt = Counter(s.get("attempt") for s in sends)
        for attempt, n in per_attempt.items():
            if n > 1:
                v.add("I2", f"invocation {inv['id']} attempt {attempt} sent {n} times (one watermark, several sends)", inv["run_id"])
    for inv in invs.values():
        if not inv["read_only"] and inv["status"] == "completed" and not sends_by_key.get(inv["idempotency_key"]):
            v.add("I2", f"side-effect invocation {inv['id']} is completed but the sink never received it (lost effect)", inv["run_id"])

    # ---- I3 fencing --------------------------------------------------------
    for run_id, evs in events_by_run.items():
        high = -1
        for e in evs:
            if e["type"] == "run.fenced":
                continue
            if e["lease_epoch"] < high:
                v.add("I3", f"event #{e['sequence']} {e['type']} carries epoch {e['lease_epoch']} after epoch {high} was written", run_id)
            high = max(high, e["lease_epoch"])
        r = runs.get(run_id)
        if r and r["status"] in TERMINAL:
            for e in evs:
                if e["type"] == "run.fenced" and e["lease_epoch"] >= r["lease_epoch"]:
                    v.add("I3", f"run.fenced at epoch {e['lease_epoch']} but the run ended at epoch {r['lease_epoch']}", run_id)
    for table in ("model_calls", "invocations", "checkpoints"):
        for row in snapshot[table]:
            r = runs.get(row["run_id"])
            if r and row["lease_epoch"] > r["lease_epoch"]:
                v.add("I3", f"{table} row written at epoch {row['lease_epoch']} > the run's epoch {r['lease_epoch']}", row["run_id"])

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

    # ---- I6 cancellation never abandons an effect -------------------------
    for inv in invs.values():
        r = runs.get(inv["run_id"])
        if r and r["status"] == "CANCELLED" and inv["effect_sent_at"] is not None and not inv["has_result"] and inv["status"] != "interrupted":
            v.add("I6", f"cancelled run keeps watermarked invocation {inv['id']} ({inv['status']}) with no result", r["id"])

    # ---- I7 approval single resolution -------------------------------------
    resolved = Counter()
    for e in snapshot["events"]:
        if e["type"] == "approval.resolved":
            resolved[e["payload"].get("approval")] += 1
    for a in approvals:
        n = resolved[a["id"]]
        if n > 1:
            v.add("I7", f"approval {a['id']} resolved {n} times", a["run_id"])
        if a["status"] in ("approved", "rejected") and n != 1:
            v.add("I7", f"approval {a['id']} is {a['status']} with {n} approval.resolved events", a["run_id"])
    ok_by_approval = Counter(d["approval"] for d in decisions if d.get("ok"))
    for aid, n in ok_by_approval.items():
        if n > 1:
            v.add("I7", f"approval {aid} accepted {n} decisions")
    for d in decisions:
        if d.get("expect") == "refused" and d.get("ok"):
            v.add("I7", f"a {d.get('why')} decision on approval {d['approval']} was accepted", d.get("run"))
    requeues = Counter()
    for e in snapshot["events"]:
        if e["type"] == "run.requeued" and e["payload"].get("reason") == "approval":
            requeues[e["run_id"]] += 1
    decided_by_run = Counter(a["run_id"] for a in approvals if a["status"] == "approved" or (a["status"] == "rejected" and a["kind"] not in RERUN_KINDS))
    for run_id, n in requeues.items():
        if n > decided_by_run[run_id]:
            v.add("I7", f"run requeued {n} times by approvals but only {decided_by_run[run_id]} decisions could requeue it", run_id)

    # ---- faults per window ---------------------------------------------------
    per_window = {k: Counter() for k in ("kill", "stop")}
    for f in kills + stops:
        held = f.get("held") or []
        if not held:
            per_window[f["kind"]]["idle"] += 1
        for h in held:
            per_window[f["kind"]][h["window"]] += 1
    by_window = {w: per_window["kill"][w] + per_window["stop"][w] for w in ALL_WINDOWS}

    # ---- I8 reconciliation exactness (report) -------------------------------
    interrupted = [a for a in approvals if a["kind"] == "interrupted_side_effect"]
    actual = {(a["invocation_id"], a.get("attempt")): a for a in interrupted}
    expected_parks: dict[tuple, dict] = {}
    explained, unexplained = [], []
    wm_faults = [(f, h) for f in kills + stops for h in (f.get("held") or []) if h["window"] == "watermark_to_result"]
    for f, h in wm_faults:
        key = (h["invocation"], h["attempt"])
        t = next((t for t in takeovers.get(h["run"], []) if t["previous_epoch"] == h["epoch"]), None)
        item = {"fault": f["id"], "kind": f["kind"], "run": h["run"], "invocation": h["invocation"], "attempt": h["attempt"]}
        if t is None:
            if f["kind"] == "stop":
                explained.append({**item, "why": "the stopped worker resumed before any takeover and went on as the owner"})
            else:
                unexplained.append({**item, "why": "killed in the watermark window but the run was never taken over from that epoch"})
            continue
        if h["invocation"] not in t["unknown"]:
            if f["kind"] == "stop":
                explained.append({**item, "why": "the zombie recorded the call's outcome before a later takeover"})
            else:
                unexplained.append({**item, "why": "the takeover did not find the killed worker's call in flight"})
            continue
        if t["decision"] == "run.waiting_for_approval":
            expected_parks[key] = item
        elif t["decision"] in ("run.failed", "run.cancelled"):
            reason = (t["decision_payload"] or {}).get("failure", {}).get("reason") if t["decision"] == "run.failed" else "cancel requested"
            explained.append({**item, "why": f"the takeover ended the run instead of parking ({t['decision']}: {reason})"})
        else:
            # a violation of seed 000's table: reported once, by the loop below
            unexplained.append({**item, "why": f"the takeover found the unknown effect but decided {t['decision']}", "table": True})
    for run_id, lst in takeovers.items():  # seed 000's table, independent of injected faults
        for t in lst:
            if t["unknown"] and t["decision"] in ("run.requeued", "run.completed"):
                v.add("I8", f"takeover at epoch {t['epoch']} found unknown effects {t['unknown']} and decided {t['decision']}", run_id)
    extra_parks = []
    for key, a in actual.items():
        if key in expected_parks:
            continue
        run_id = a["run_id"]
        t = next((t for t in takeovers.get(run_id, []) if a["invocation_id"] in t["unknown"] and t["decision"] == "run.waiting_for_approval"), None)
        cause = "no takeover found"
        if t is not None:
            same_epoch = [f for f in kills + stops for h in (f.get("held") or []) if h["run"] == run_id and h["epoch"] == t["previous_epoch"]]
            fenced = [e for e in events_by_run[run_id] if e["type"] == "run.fenced" and e["lease_epoch"] == t["previous_epoch"]]
            if any(f["kind"] == "stop" for f in same_epoch):
                cause = "a SIGSTOPped zombie wrote its watermark after SIGCONT, self-fenced before sending, then lost its lease"
            elif same_epoch:
                cause = f"fault {[f['id'] for f in same_epoch]} at this epoch was classified {[h['window'] for f in same_epoch for h in f['held']]}"
            elif fenced:
                cause = "the worker self-fenced (no injected fault at this epoch: missed heartbeats under load)"
            else:
                cause = "no injected fault at this epoch"
        extra_parks.append({"approval": a["id"], "run": run_id, "invocation": a["invocation_id"], "attempt": a.get("attempt"), "cause": cause})
    i8 = {
        "interrupted_side_effect_approvals": len(interrupted),
        "faults_in_watermark_window": len(wm_faults),
        "faults_in_watermark_window_kill": sum(1 for f, _ in wm_faults if f["kind"] == "kill"),
        "faults_in_watermark_window_stop": sum(1 for f, _ in wm_faults if f["kind"] == "stop"),
        "equal": len(interrupted) == len(wm_faults),
        "expected_parks": len(expected_parks),
        "matched": sum(1 for k in expected_parks if k in actual),
        "expected_parks_missing": [v_ for k, v_ in expected_parks.items() if k not in actual],
        "faults_without_park_explained": explained,
        "faults_without_park_unexplained": unexplained,
        "parks_without_watermark_fault": extra_parks,
    }
    for item in i8["expected_parks_missing"]:
        v.add("I8", f"takeover parked invocation {item['invocation']} but no interrupted_side_effect approval matches attempt {item['attempt']}", item["run"])
    for item in unexplained:
        if item["kind"] == "kill" and not item.get("table"):
            v.add("I8", item["why"], item["run"], fault=item["fault"])

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
        v.add("I1", f"worker killed holding epoch {item['epoch']} but no takeover from that epoch (run {r['status'] if r else '?'})", item["run"])

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
        throughput = {"runs_terminal": len(term_at), "span_s": round(span, 1), "runs_per_min": round(len(term_at) / span * 60, 1) if span > 0 else None}
    submitted = {r["id"]: r.get("submitted_at") for r in snapshot["runs"]}
    run_latency = [term_at[r] - submitted[r] for r in term_at if submitted.get(r)]
    approvals_summary = {
        "by_kind_status": {f"{k}:{s}": n for (k, s), n in sorted(Counter((a["kind"], a["status"]) for a in approvals).items())},
        "decisions_ok": sum(1 for d in decisions if d.get("ok")),
        "decisions_refused_as_expected": sum(1 for d in decisions if d.get("expect") == "refused" and not d.get("ok")),
        "decisions_failed_unexpectedly": [d for d in decisions if d.get("expect") == "ok" and not d.get("ok")],
        "decisions_skipped_not_pending": sum(1 for d in decisions if d.get("expect") == "skip"),
    }
    sends = {"total": len(sink), "keys": len(sends_by_key), "authorized_resends": dup_sends,
             "by_attempt": dict(sorted(Counter(str(s.get("attempt")) for s in sink).items()))}
    return {
        "violations": list(v),
        "violations_by_invariant": dict(Counter(x["invariant"] for x in v)),
        "runs": len(runs),
        "statuses": dict(statuses),
        "failure_reasons": dict(reasons),
        "faults": {
            "kills": len(kills), "stops": len(stops),
            "planned": sum(1 for f in kills + stops if f.get("source") == "planned"),
            "random": sum(1 for f in kills + stops if f.get("source") == "random"),
            "kill_by_window": {w: per_window["kill"][w] for w in ALL_WINDOWS},
            "stop_by_window": {w: per_window["stop"][w] for w in ALL_WINDOWS},
            "by_window": by_window,
            "cancels": sum(1 for f in faults if f.get("kind") == "cancel"),
            "aborted_freezes": sum(1 for f in faults if f.get("kind") == "aborted"),
        },
        "windows_hit": {w: by_window[w] > 0 for w in WINDOWS},
        "kill_windows_hit": {w: per_window["kill"][w] > 0 for w in WINDOWS},
        "i8": i8,
        "takeover_latency_s": {"kill": _dist(lat_kill), "stop_during_stop": _dist(lat_stop), "kills_without_takeover": no_takeover},
        "takeovers": sum(len(x) for x in takeovers.values()),
        "approvals": approvals_summary,
        "sends": sends,
        "throughput": throughput,
        "run_latency_s": _dist(run_latency),
    }


def load_artifacts(folder: Path) -> tuple[dict, list, list, list]:
    def jsonl(name):
        p = folder / name
        return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.exists() else []

    return json.loads((folder / "snapshot.json").read_text()), jsonl("sink.jsonl"), jsonl("faults.jsonl"), jsonl("decisions.jsonl")


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
