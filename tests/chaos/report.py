"""The chaos soak's markdown report (a pure function of the checker's report
plus the soak's configuration).

    python -m tests.chaos.report ARTIFACT_DIR [--out PATH]            # re-check a soak's artifacts, render again
    python -m tests.chaos.report --from BUNDLE.tar.xz [--check MD]    # the same from an artifact bundle
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

# The report's headline, which README.md quotes; tests/chaos/test_soak_report.py parses both with HEADLINE_RE.
HEADLINE = (
    "**{deaths:,} process deaths** ({sigkill:,} SIGKILLs of the deployment's processes, {backends:,} PostgreSQL "
    "backends terminated, {restarts} PostgreSQL restart, {redis} Redis restart) over {runs:,} runs, seed {seed}: "
    "**{violations} violations**"
)
HEADLINE_RE = re.compile(
    r"\*\*(?P<deaths>[\d,]+) process deaths\*\* \((?P<sigkill>[\d,]+) SIGKILLs of the deployment's processes, "
    r"(?P<backends>[\d,]+) PostgreSQL backends terminated, (?P<restarts>\d+) PostgreSQL restarts?, "
    r"(?P<redis>\d+) Redis restarts?\) over (?P<runs>[\d,]+) runs, seed (?P<seed>\d+): "
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
    "redis_restart": "Redis restart (SIGKILL)",
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
        redis=d.get("redis_restarts", 0),
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


def carve_outs_section(r: dict) -> list[str]:
    """Where the faults reached that the soak once spared (issue 33 item 6)."""
    cov = r.get("coverage")
    if not cov:
        return []
    st = cov["stops_by_target"]
    dr = cov["drain"]
    return [
        "## No carve-outs: where the faults reached",
        "",
        f"- SIGSTOP by what it froze: {st['busy_worker']} workers holding a lease, {st['idle_worker']} idle workers, "
        f"{st['node']} whole qcluster nodes (main process, sentinel, pusher, monitor and workers at once; the runs "
        f"their workers held: {cov['node_stop_workers_held']}, node stops by window {cov['node_stops_by_window']})",
        f"- kills within the first {cov['kills_within_first_s']:g} s of their process's start (a node's processes: "
        f"of the node's generation): {cov['kills_young']} of {cov['kills_with_uptime']} — "
        f"{cov['kills_young_by_type']}",
        f"- the drain (after the last submit) went on under the random faults: {dr['deaths']} deaths and "
        f"{dr['stops']} stops — {dr['deaths_by_type']}",
        "",
    ]


def outside_section(r: dict) -> list[str]:
    """Redis and the effect sink, restarted under load."""
    sr = r.get("sink_restarts")
    if sr is None:
        return []
    deaths = r.get("deaths") or {}
    rec = r.get("recovery_s") or {}
    lines = ["## Redis and the effect sink restarted", ""]
    redis = r.get("redis_restarts") or []
    lines.append(
        f"- Redis restarts (SIGKILL, started again empty on its port): {deaths.get('redis_restarts', 0)}"
        + "".join(
            f"; {f.get('connected_clients_before')} clients connected and {f.get('commands_before')} commands "
            f"served before it, down {round(f['t_ready'] - f['t'], 3)} s"
            for f in redis
        )
        + (
            f"; → next claim anywhere {rec['next_claim_anywhere']['redis_restart']['max']} s"
            if (rec.get("next_claim_anywhere") or {}).get("redis_restart")
            else ""
        )
    )
    lines.append(
        f"- effect sink restarts (SIGKILL with a POST held in flight, started again on its port): {sr['restarts']}; "
        f"POSTs in flight when it died: {sr['in_flight']}; connections reset → unknown outcomes (`uncertain`): "
        f"{sr['resets_ended_uncertain']}; overtaken by a process fault while their worker waited: "
        f"{sr['resets_overtaken']}; calls refused while it was down (`connection_failed`, nothing sent): "
        f"{sr['refused_while_down']}"
    )
    for x in sr["by_restart"]:
        lines.append(
            f"  - at {x['at']}: down {x['down_s']} s, held a POST: {x['held_a_post']}, in flight {x['in_flight']}, "
            f"reset → uncertain {x['reset_ended_uncertain']} (+{x['cut_before_logged_ended_uncertain']} cut before "
            f"the sink logged them), overtaken {x['reset_overtaken_by_a_process_fault']}, refused "
            f"{x['refused_while_down']}; "
            + ", ".join(
                f"{c['key'][:8]}…/{c['attempt']}{' (held)' if c['held'] else ''}: {c['ended']}" for c in x["cut"]
            )
        )
    lines.append("")
    return lines


def reconcilers_section(r: dict) -> list[str]:
    rc = r.get("reconcilers")
    if not rc or not rc.get("tools"):
        return []
    lines = [
        "## Runs whose tool reconciles its own calls",
        "",
        f"- {rc['runs']} runs made their side effects with {', '.join(f'`{t}`' for t in rc['tools'])} (the same "
        "request as `http_post`, with a per-tool reconciler that asks the sink for the key: tests/chaos/tools.py); "
        "the others with `http_post`, whose unknown outcomes an operator decides",
        f"- reconciler answers: {rc['answers']} {rc['answers_by_outcome']}; answers that do not follow its rule or "
        f"what the sink held: {len(rc['answers_wrong'])}",
        f"- decisions on those calls' unknown outcomes: {rc['decisions']} {rc['decisions_by_kind']}, by answer "
        f"{rc['decisions_by_answer']}; the runtime followed the answer: {rc['followed']}, did not: "
        f"{len(rc['not_followed'])}",
    ]
    for x in rc["not_followed"][:20]:
        lines.append(f"  - run {str(x['run'])[:8]}: {x['why']}")
    lines.append("")
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
                f"- stops freeze {c['stop_mix']}; kills from a process's first second on (a node's main process and "
                f"sentinel, run_maintenance and a web node after a seeded U(0, {c.get('grace', 0):g}) s grace per "
                f"generation, their other processes from their start); the random faults go on through the drain; "
                f"{c.get('reconciled_runs', 0)} runs ({c['reconciled_fraction']:g}) with a reconciled tool, conflict "
                f"share {c.get('conflict_share')}; Redis of its own: {c.get('redis')}, restarted: "
                f"{c.get('redis_restart')}; effect sink restarts: {c.get('sink_restarts')}"
            ]
            if c.get("stop_mix")
            else []
        ),
        *(
            [
                f"- stopped early: SIGUSR1 after {c['stopped_early_at_deaths']} process deaths (no more submits, then "
                f"every submitted run "
                f"was driven to its end under the same faults); the command's target is {c.get('deaths_target')} deaths"
            ]
            if c.get("stopped_early_at_deaths") is not None
            else []
        ),
        f"- artifacts: `{c['artifacts']}` (snapshot.json, sink.jsonl, faults.jsonl, decisions.jsonl, reconcile.jsonl, "
        f"process logs; re-check with `python -m tests.chaos.checker <dir>`)",
        *([f"- {c['bundle']}"] if c.get("bundle") else []),
        "",
        f"## Verdict: {verdict}",
        "",
        f"Violations by invariant: {r.get('violations_by_invariant') or {}}",
        "",
        *(
            [
                f"## Findings (written by hand, `{r['findings']['path']}`: what the violations are)",
                "",
                r["findings"]["text"],
                "",
            ]
            if r.get("findings")
            else []
        ),
        *deaths_section(r),
        *carve_outs_section(r),
        *outside_section(r),
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
        "/ cancel) or releases it. `kill@after_result` watches the database for the run's first committed side-effect "
        "result and kills during the next (700 ms) model call. Random faults: every U(kill_every) s a process type is "
        f"drawn from the kill mix ({c.get('kill_mix', 'workers holding a lease only')}) and one of its processes is "
        "SIGKILLed (a backend: `pg_terminate_backend`) — a node's pusher, monitor and workers from their start, its "
        "main process and sentinel, run_maintenance and a web node after a seeded U(0, grace) s per generation; "
        "every U(stop_every) s "
        + (
            f"what the stop mix ({c['stop_mix']}) draws is SIGSTOPped — a worker holding a lease, an idle worker, or a "
            "whole qcluster node (its process group at once)"
            if c.get("stop_mix")
            else "a worker holding a lease is SIGSTOPped"
        )
        + "; PostgreSQL (the soak's own cluster) is restarted once, in immediate mode, under load"
        + (
            "; so is the soak's own Redis (SIGKILL, started again empty), and the effect sink is SIGKILLed with a POST "
            "it holds in flight and started again on its port"
            if c.get("stop_mix")
            else ""
        )
        + ". "
        + ("The random faults go on through the drain, until every run has ended. " if c.get("stop_mix") else "")
        + "A supervised process that exits is started again by the soak; submits over HTTP that get no answer are "
        "sent again with the same Idempotency-Key.",
        "- Window of every kill/stop (freeze, classify, act): SIGSTOP the worker, wait for /proc state T + 80 ms, read "
        "the run "
        "whose `lease_owner` names its pid and that run's side-effect invocations (frozen, so exact): `executing` → "
        "watermark_to_result, `authorized` → before_watermark, a result → after_result, none → no_effect; then "
        "SIGKILL, "
        "or SIGCONT after U(L, 3L). A worker found holding no lease is killed (stopped) as an idle worker when the "
        "draw was an idle worker, else SIGCONTed and counted as aborted. A whole node is frozen at once (SIGSTOP of "
        "its process group) and each of its workers classified while all are stopped.",
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
        "- Runs whose tool reconciles its own calls (`reconciled_post`): at an unknown outcome Resume asks the tool's "
        "reconciler, which reads the sink's log for the key — `conflict` for a seeded share of the keys, else "
        "`continue` when the sink holds it, else `waiting` (a `reconcile` approval the operator decides). The checker "
        "judges each answer against that rule and the sink's log, and each decision against the answer it calls for.",
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
    lines += ["", *reconcilers_section(r), "## Violations", ""]
    if not r["violations"]:
        lines.append("None (I1–I8 hold).")
    for x in r["violations"][:200]:
        lines.append(f"- **{x['invariant']}** run {x.get('run')}: {x['detail']}")
    lg = r.get("logs_judged")
    lines += ["", "## Process logs", ""]
    if lg:
        lines.append(
            f"- tracebacks: {lg['tracebacks']}, explained by a fault of the soak (every exception of the chain a lost "
            f"database or Redis connection, after a restart or a terminate of that process's backend; a node whose "
            f"sentinel died starting): {lg['explained_by_db_fault']}, unexplained (violations): {lg['unexplained']}"
        )
        for name, x in lg["by_process"].items():
            lines.append(f"  - {name}: {x['tracebacks']} ({x['causes']})")
    sub = r.get("submits")
    if sub:
        lines.append(f"- submits: {sub}")
    logs = {
        name: {k: (len(v) if k == "worker_pids" else v) for k, v in x.items()}
        for name, x in (r.get("logs") or {}).items()
    }
    lines += ["", f"Counts from the logs (worker_pids: how many workers each node's log names): {logs}", ""]
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


def shown_path(path: Path) -> str:
    """A path as a reader of the repository types it: relative to its root when inside it."""
    from tests.chaos.procs import ROOT

    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def from_bundle(bundle: Path, findings: Path | None = None) -> tuple[dict, str]:
    """The report re-derived from an artifact bundle (tests/chaos/bundle.py); `findings`, a markdown file
    written by hand (what the violations are), is shown as it is under the verdict."""
    import tempfile

    from tests.chaos.bundle import unpack

    with tempfile.TemporaryDirectory() as tmp:
        report, _ = rerender(unpack(bundle, Path(tmp)))
    where = shown_path(bundle)
    also = f" --findings {shown_path(findings)}" if findings is not None else ""
    report["config"]["bundle"] = (
        f"re-derived from the artifact bundle `{where}` ({bundle.stat().st_size / 1e6:.2f} MB): "
        f"`python -m tests.chaos.report --from {where}{also}`"
    )
    if findings is not None:
        report["findings"] = {"path": shown_path(findings), "text": findings.read_text().strip()}
    return report, render_markdown(report)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m tests.chaos.report",
        description="Re-check a soak's artifacts (a folder, or a bundle with --from) and render its report again.",
    )
    p.add_argument("folder", nargs="?", help="a soak's artifact folder (its report.json and report.md are rewritten)")
    p.add_argument("--from", dest="bundle", default=None, help="an artifact bundle (tests/chaos/bundle.py)")
    p.add_argument(
        "--findings", default=None, help="with --from: a markdown file, written by hand, on what the violations are"
    )
    p.add_argument("--out", default=None, help="also write the markdown here")
    p.add_argument("--check", default=None, help="exit 1 unless the markdown is exactly this file's")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    if (a.folder is None) == (a.bundle is None):
        p.error("give an artifact folder or --from BUNDLE")
    if a.bundle:
        report, md = from_bundle(Path(a.bundle), Path(a.findings) if a.findings else None)
    else:
        report, md = rerender(Path(a.folder))
        (Path(a.folder) / "report.json").write_text(json.dumps(report, indent=2, default=str))
        (Path(a.folder) / "report.md").write_text(md)
    if a.out:
        Path(a.out).write_text(md)
    print(md)
    if a.check:  # the exit status says whether the file is what the artifacts re-derive, not whether they pass
        if Path(a.check).read_text() == md:
            return 0
        import difflib

        diff = difflib.unified_diff(
            Path(a.check).read_text().splitlines(), md.splitlines(), a.check, "re-derived", lineterm=""
        )
        print("\n".join(diff), file=sys.stderr)
        return 1
    return 1 if report["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
