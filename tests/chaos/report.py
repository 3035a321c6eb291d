"""The chaos soak's markdown report (a pure function of the checker's report
plus the soak's configuration).

    python -m tests.chaos.report ARTIFACT_DIR [--out PATH]   # re-check a soak's artifacts and render its report again
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

# The report's headline, which README.md quotes; tests/chaos/test_soak_report.py parses both with HEADLINE_RE.
HEADLINE = (
    "**{deaths:,} process deaths** ({sigkill:,} SIGKILLs of the deployment's processes, {backends:,} PostgreSQL "
    "backends "
    "terminated, {restarts} PostgreSQL restart) over {runs:,} runs, seed {seed}: **{violations} violations**"
)
HEADLINE_RE = re.compile(
    r"\*\*(?P<deaths>[\d,]+) process deaths\*\* \((?P<sigkill>[\d,]+) SIGKILLs of the deployment's processes, "
    r"(?P<backends>[\d,]+) "
    r"PostgreSQL backends terminated, (?P<restarts>\d+) PostgreSQL restarts?\) over (?P<runs>[\d,]+) runs, seed "
    r"(?P<seed>\d+): "
    r"\*\*(?P<violations>\d+) violations\*\*"
)
TYPE_LABELS = {
    "busy_worker": "worker holding a lease",
    "idle_worker": "idle worker",
    "pusher": "pusher",
    "monitor": "monitor",
    "sentinel": "sentinel",
    "qcluster_main": "qcluster main",
    "run_maintenance": "run_maintenance",
    "web_node": "web node (daphne)",
    "pg_backend": "PostgreSQL backend (pg_terminate_backend)",
    "postgres_restart": "PostgreSQL restart (immediate)",
}
WINDOW_ORDER = (
    "before_watermark",
    "watermark_to_result",
    "after_result",
    "no_effect",
    "idle",
    "submit_in_flight",
    "no_submit",
    "active",
    "idle in transaction",
    "-",
)


def headline(r: dict) -> str:
    d = r.get("deaths") or {}
    return HEADLINE.format(
        deaths=d.get("total", 0),
        sigkill=d.get("sigkill", 0),
        backends=d.get("pg_backends_terminated", 0),
        restarts=d.get("pg_restarts", 0),
        runs=r["runs"],
        seed=r["config"]["seed"],
        violations=len(r["violations"]),
    )


def parse_headline(text: str) -> dict | None:
    m = HEADLINE_RE.search(text)
    return {k: int(v.replace(",", "")) for k, v in m.groupdict().items()} if m else None


def deaths_section(r: dict) -> list[str]:
    d = r.get("deaths")
    if not d:
        return []
    windows = [w for w in WINDOW_ORDER if any(w in c for c in d["by_type_window"].values())]
    windows += sorted({w for c in d["by_type_window"].values() for w in c} - set(windows))
    lines = [
        "## Process deaths by process type and window",
        "",
        f"- {headline(r)}",
        f"- by source: {d['by_source']}; restarted by the soak as their supervisor (systemd Restart=on-failure): "
        f"{d['supervisor_restarts']} (exit status per role: {d['supervisor_exit_status']})",
        "- window: for a worker, the window of the run it held when frozen (`idle`: it held none); for a pusher, "
        "monitor, "
        "sentinel, qcluster main or the restart, the worst window among the runs its node's (or every node's) workers "
        "held; "
        "for a web node, whether a submit was in flight to it; for a backend, its `pg_stat_activity.state`",
        "",
        "| process type | " + " | ".join(windows) + " | total |",
        "|---|" + "---|" * (len(windows) + 1),
    ]
    for t, c in d["by_type_window"].items():
        lines.append(
            f"| {TYPE_LABELS.get(t, t)} | "
            + " | ".join(str(c.get(w, 0)) for w in windows)
            + f" | {d['by_type'].get(t, 0)} |"
        )
    lines += [
        "",
        f"Every process type died at least once: {all(d['types_hit'].values())} "
        f"{[t for t, hit in d['types_hit'].items() if not hit] or ''}",
        "",
    ]
    return lines


def recovery_section(r: dict) -> list[str]:
    rec = r.get("recovery_s")
    if not rec:
        return []
    fmt = lambda x: f"n {x['n']}, p50 {x['p50']}, p95 {x['p95']}, max {x['max']}"  # noqa: E731
    lines = [
        "## Recovery (figures, not assertions)",
        "",
        "| died | → next claim anywhere (s) | → next claim by the same node (s) |",
        "|---|---|---|",
    ]
    types = sorted(set(rec["next_claim_anywhere"]) | set(rec["next_claim_same_node"]))
    for t in types:
        a, b = rec["next_claim_anywhere"].get(t), rec["next_claim_same_node"].get(t)
        lines.append(f"| {TYPE_LABELS.get(t, t)} | {fmt(a) if a else '—'} | {fmt(b) if b else '—'} |")
    q = rec["queue_wait"]
    lines += [
        "",
        f"- a killed web node → its next answered submit (s): {fmt(rec['web_node_next_answer'])}",
        f"- PostgreSQL restart: down for {rec['postgres_restart_downtime']} s (stop → accepting connections)",
        f"- queued runs, created or requeued → claimed (s): {fmt(q)}, mean {q['mean']}; waits over lease + 10 s: "
        f"{q['over_lease_plus_10']}",
        "",
    ]
    return lines


def render_markdown(r: dict) -> str:
    c = r["config"]
    f = r["faults"]
    i8 = r["i8"]
    lat = r["takeover_latency_s"]
    u = r.get("uncertain") or {}
    ub = f.get("uncertain_by_window") or {}
    default_command = f"python -m tests.chaos.soak --runs {c['runs']} --workers {c['workers']} --seed {c['seed']}"
    verdict = f"FAIL — {len(r['violations'])} violation(s)" if r["violations"] else "PASS — 0 violations"
    lines = [
        "# Chaos soak report",
        "",
        f"- command: `{c.get('command') or default_command}`",
        f"- N = {c['runs']} runs, seed {c['seed']}, {c['workers']} workers in {c['clusters']} qcluster(s) + 1 "
        f"run_maintenance, lease {c['lease_seconds']} s, max in flight {c['max_inflight']}, wall {c['wall_s']} s",
        f"- random kills every U{tuple(c['kill_every']) if c['kill_every'] else 'off'} s, stops every "
        f"U{tuple(c['stop_every']) if c['stop_every'] else 'off'} s "
        f"for U(L, 3L); cancel rate {c['cancel_rate']}; approve rate {c['approve_rate']}; planned fraction "
        f"{c['planned_fraction']}"
        + (
            f"; sink drops {c['sink_drop_rate']} / delays {c['sink_delay_rate']} of the POSTs (answer after "
            f"{c['sink_delay']} s, "
            f"call timeout {c.get('post_timeout')} s); uncertain decisions approve/confirm-true/confirm-false/reject "
            f"{c['uncertain_mix']}"
            if c.get("sink_drop_rate") is not None
            else ""
        )
        + (" — **baseline, no faults**" if c["no_faults"] else ""),
        *(
            [
                f"- stopped early: SIGUSR1 after {c['stopped_early_at_deaths']} process deaths (no more submits, then "
                f"every submitted run "
                f"was driven to its end under the same faults); the command's target is {c.get('deaths_target')} deaths"
            ]
            if c.get("stopped_early_at_deaths") is not None
            else []
        ),
        f"- artifacts: `{c['artifacts']}` (snapshot.json, sink.jsonl, faults.jsonl, decisions.jsonl, process logs; "
        f"re-check with `python -m tests.chaos.checker <dir>`)",
        "",
        f"## Verdict: {verdict}",
        "",
        f"Violations by invariant: {r.get('violations_by_invariant') or {}}",
        "",
        *deaths_section(r),
        *recovery_section(r),
        "## Faults at workers, by window",
        "",
        f"- SIGKILL: {f['kills']}, SIGSTOP: {f['stops']} (planned {f['planned']}, random {f['random']}); "
        f"operator cancels: {f['cancels']}; freezes aborted (worker held no lease): {f['aborted_freezes']}",
        "",
        "- uncertain outcomes (a live side-effect call sent and not answered, no process death): "
        f"{u.get('outcomes', 0)} — "
        f"per tool {u.get('by_tool', {})}, per cause {u.get('by_cause', {})}; the sink dropped/delayed "
        f"{u.get('sink_faults', {})} "
        f"POSTs, {u.get('sink_faults_that_ended_uncertain', 0)} of them ended uncertain, "
        f"{u.get('sink_faults_overtaken_by_a_process_fault', 0)} were overtaken by a kill/stop while the worker waited "
        f"(parked interrupted_side_effect, I8)",
        "",
        "Kills and stops of workers (busy or idle) by the window of the run they held; uncertain outcomes (no process "
        "died) "
        "by theirs.",
        "",
        "| window | kills | stops | uncertain | total |",
        "|---|---|---|---|---|",
    ]
    for w in ("before_watermark", "watermark_to_result", "after_result", "no_effect", "idle"):
        lines.append(
            f"| {w} | {f['kill_by_window'][w]} | {f['stop_by_window'][w]} | {ub.get(w, 0)} | "
            f"{f['by_window'][w] + ub.get(w, 0)} |"
        )
    lines += ["", f"Kills landed in every window: {all(r['kill_windows_hit'].values())} {r['kill_windows_hit']}", ""]
    if r.get("planned"):
        lines += [
            "Planned faults (plan: runs → landed): "
            + ", ".join(f"{k}: {v['runs']}→{v['landed']}" for k, v in r["planned"].items()),
            "",
        ]
    lines += [
        "## Method",
        "",
        "- Planned faults: the cluster pauses every run once at `tool.before_watermark`, `tool.after_watermark` and "
        "`tool.after_execute` (fault points, action `pause`); the soak applies the run's plan there (SIGKILL / SIGSTOP "
        "/ cancel) "
        "or releases it. `kill@after_result` watches the database for the run's first committed side-effect result and "
        "kills "
        "during the next (700 ms) model call. Random faults: every U(kill_every) s a process type is drawn from the "
        "kill mix "
        f"({c.get('kill_mix', 'workers holding a lease only')}) and one of its processes is SIGKILLed (a backend: "
        "`pg_terminate_backend`); every U(stop_every) s a worker holding a lease is SIGSTOPped; PostgreSQL (the soak's "
        "own "
        "cluster) is restarted once, in immediate mode, under load. A supervised process that exits is started again "
        "by the "
        "soak; submits over HTTP that get no answer are sent again with the same Idempotency-Key.",
        "- Window of every kill/stop (freeze, classify, act): SIGSTOP the worker, wait for /proc state T + 80 ms, read "
        "the run "
        "whose `lease_owner` names its pid and that run's side-effect invocations (frozen, so exact): `executing` → "
        "watermark_to_result, `authorized` → before_watermark, a result → after_result, none → no_effect; then "
        "SIGKILL, "
        "or SIGCONT after U(L, 3L). A worker found holding no lease is killed as an idle worker when the draw was an "
        "idle worker, "
        "else SIGCONTed and counted as aborted.",
        "- Unknown outcomes without a process death: the sink (seeded per effect content and attempt) closes the "
        "connection "
        "of some effect POSTs after reading the request, and answers some only after the call's timeout; the call ends "
        "`uncertain` and the run parks on an `uncertain_side_effect` approval, which the operator approves (one "
        "re-send, same "
        "key), confirms (took_effect true/false: nothing is sent again) or rejects. I2 treats them like kills in the "
        "watermark "
        "window: no second delivery of an effect, under any key, without an approval of a re-run decided before it.",
        "- I8 pairs each watermark-window fault (invocation, attempt) with the takeover from that epoch (its "
        "`step.interrupted` "
        "events and its decision) and with the `interrupted_side_effect` approval (presentation attempt).",
        "",
        "## Runs",
        "",
        f"- terminal statuses: {r['statuses']}",
        f"- failure reasons: {r['failure_reasons']}",
        "- every end, judged against the run's plan and the recorded faults and decisions (I1; unexplained ones are "
        "violations):",
    ]
    for end, e in (r.get("outcomes") or {}).items():
        lines.append(f"  - {end}: {e['n']} (explained {e['explained']}, unexplained {e['unexplained']}) — {e['why']}")
    lines += [
        f"- rows checked against the epoch in force at their transaction (I3): {r.get('fencing')}",
        f"- approvals (kind:status): {r['approvals']['by_kind_status']}",
        f"- operator decisions accepted: {r['approvals']['decisions_ok']}; wrong-hash / second decisions refused as "
        f"expected: {r['approvals']['decisions_refused_as_expected']}; skipped (approval no longer pending): "
        f"{r['approvals'].get('decisions_skipped_not_pending', 0)}; decisions that failed unexpectedly: "
        f"{len(r['approvals']['decisions_failed_unexpectedly'])}",
        f"- effect sink: {r['sends']}",
        f"- takeovers: {r['takeovers']}",
        f"- throughput: {r['throughput']}"
        + (
            f"; no-fault baseline {r['baseline']['runs_per_min']} runs/min ({r['baseline']['runs']} runs) → ratio "
            f"**{r['baseline']['ratio']}** "
            f"(gate ≥ 0.5)"
            if r.get("baseline")
            else ""
        ),
        f"- per-run latency (submit → terminal, s): {r['run_latency_s']}",
        f"- takeover latency (worker frozen → `lease.taken_over`, s) after SIGKILL: {lat['kill']}",
        f"- takeover while a worker was SIGSTOPped (s): {lat['stop_during_stop']}",
        "",
        "## I8 — interrupted_side_effect approvals vs faults in the watermark window",
        "",
        f"- interrupted_side_effect approvals: **{i8['interrupted_side_effect_approvals']}**",
        f"- faults that landed in [watermark, result): **{i8['faults_in_watermark_window']}** "
        f"(SIGKILL {i8['faults_in_watermark_window_kill']}, SIGSTOP {i8['faults_in_watermark_window_stop']})",
        "- equal (checked: every fault in the window ends in a recorded decision, every park comes from a takeover "
        f"that found the call in flight): **{i8['equal']}**; {i8.get('accounting')}",
        f"- of those faults, {i8['expected_parks']} should have parked and {i8['matched']} did",
        f"- faults in the window that legitimately did not park: {len(i8['faults_without_park_explained'])}",
    ]
    for item in i8["faults_without_park_explained"][:20]:
        lines.append(f"  - fault {item['fault']} ({item['kind']}), run {item['run'][:8]}: {item['why']}")
    lines.append(f"- faults in the window that did not park, unexplained: {len(i8['faults_without_park_unexplained'])}")
    for item in i8["faults_without_park_unexplained"][:20]:
        lines.append(f"  - fault {item['fault']} ({item['kind']}), run {item['run'][:8]}: {item['why']}")
    lines.append(f"- parks without a fault in the window: {len(i8['parks_without_watermark_fault'])}")
    for item in i8["parks_without_watermark_fault"][:20]:
        lines.append(
            f"  - run {item['run'][:8]} invocation {item['invocation'][:8]} attempt {item['attempt']}: {item['cause']}"
        )
    for item in i8.get("parks_unexplained") or []:
        lines.append(
            f"  - UNEXPLAINED run {item['run'][:8]} invocation {item['invocation'][:8]} attempt {item['attempt']}: "
            f"{item['cause']}"
        )
    lines += [
        "",
        "## Uncertain outcomes vs uncertain_side_effect approvals (issue 11)",
        "",
        f"- uncertain outcomes: **{u.get('outcomes', 0)}**; uncertain_side_effect approvals: "
        f"**{u.get('approvals', 0)}** "
        f"({u.get('approvals_by_status', {})})",
        "- equal (checked: every uncertain (invocation, attempt) parked on its own approval — or the reconciler / a "
        f"cancel answered it — and every approval names an attempt that ended uncertain): **{u.get('equal')}**; parked "
        f"{u.get('parked', 0)}, "
        f"answered otherwise {len(u.get('explained_otherwise') or [])}, unexplained {len(u.get('unexplained') or [])}, "
        f"approvals without an uncertain outcome {len(u.get('parks_unexplained') or [])}",
    ]
    for item in (u.get("explained_otherwise") or [])[:20]:
        lines.append(
            f"  - run {item['run'][:8]} invocation {str(item['invocation'])[:8]} attempt {item['attempt']}: "
            f"{item['why']}"
        )
    lines += ["", "## Violations", ""]
    if not r["violations"]:
        lines.append("None (I1–I8 hold).")
    for x in r["violations"][:200]:
        lines.append(f"- **{x['invariant']}** run {x.get('run')}: {x['detail']}")
    lg = r.get("logs_judged")
    lines += ["", "## Process logs", ""]
    if lg:
        lines.append(
            f"- tracebacks: {lg['tracebacks']}, explained by a database fault of the soak (every exception of the "
            f"chain a lost "
            f"connection, after the restart or a terminate of that process's backend): {lg['explained_by_db_fault']}, "
            f"unexplained (violations): {lg['unexplained']}"
        )
        for name, x in lg["by_process"].items():
            lines.append(f"  - {name}: {x['tracebacks']} ({x['causes']})")
    sub = r.get("submits")
    if sub:
        lines.append(f"- submits: {sub}")
    lines += ["", f"Counts from the logs: {r.get('logs')}", ""]
    return "\n".join(lines) + "\n"


def rerender(folder: Path) -> tuple[dict, str]:
    """Re-check a soak's artifacts with today's checker and render the report
    again, with the configuration the soak recorded (report.json)."""
    from tests.chaos.checker import check, load_artifacts

    old = json.loads((folder / "report.json").read_text())
    report = check(*load_artifacts(folder))
    for key in ("config", "planned", "baseline", "logs"):
        if key in old:
            report[key] = old[key]
    args = folder / "args.json"
    if args.exists():  # what a soak recorded before its report carried the fleet's configuration
        a = json.loads(args.read_text())
        for k, ck in (
            ("kill_mix", "kill_mix"),
            ("web_nodes", "web_nodes"),
            ("web_fraction", "web_fraction"),
            ("deaths", "deaths_target"),
        ):
            report["config"].setdefault(ck, a.get(k))
    report["logs"] = {
        name: {k: v for k, v in x.items() if k != "traceback_list"} for name, x in (report.get("logs") or {}).items()
    }
    return report, render_markdown(report)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m tests.chaos.report")
    p.add_argument("folder")
    p.add_argument("--out", default=None)
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    report, md = rerender(Path(a.folder))
    (Path(a.folder) / "report.json").write_text(json.dumps(report, indent=2, default=str))
    (Path(a.folder) / "report.md").write_text(md)
    if a.out:
        Path(a.out).write_text(md)
    print(md)
    return 1 if report["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
