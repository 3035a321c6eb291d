"""The chaos soak's markdown report (a pure function of the checker's report
plus the soak's configuration)."""

from __future__ import annotations


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
        f"- artifacts: `{c['artifacts']}` (snapshot.json, sink.jsonl, faults.jsonl, decisions.jsonl, process logs; "
        f"re-check with `python -m tests.chaos.checker <dir>`)",
        "",
        f"## Verdict: {verdict}",
        "",
        "## Faults",
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
        "kills during the next (700 ms) model call. Random faults: SIGKILL / SIGSTOP of a random worker holding a live "
        "lease.",
        "- Window of every kill/stop (freeze, classify, act): SIGSTOP the worker, wait for /proc state T + 80 ms, read "
        "the run "
        "whose `lease_owner` names its pid and that run's side-effect invocations (frozen, so exact): `executing` → "
        "watermark_to_result, `authorized` → before_watermark, a result → after_result, none → no_effect; then "
        "SIGKILL, "
        "or SIGCONT after U(L, 3L). A worker found holding no lease is SIGCONTed and counted as aborted (never killed "
        "idle: an idle django-q2 worker holds the task queue's read lock).",
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
    lines += ["", "## Process logs", "", f"{r.get('logs')}", ""]
    return "\n".join(lines) + "\n"
