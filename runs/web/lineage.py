"""The live pages of a run's lineage: "Fork from here" (a POST from the run
page, through the fork service) and two runs side by side (the compare page,
rendered on the server from the compare selector; every text a model, a tool
or a user wrote goes through the template's escaping)."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from runs.errors import RunError, RunNotFound
from runs.models import TERMINAL, Run
from runs.services.compare import run_compare
from runs.services.lineage import run_fork, run_replay
from runs.services.scoping import in_scope, run_actionable, run_visible, runs_visible_to, scoped_one

PUBLISH_PERMISSION = "runs.publish_agent"
SHOWN = 50  # forks and replays listed on the run page, oldest first


def _run_or_404(user, run_id, *, acting: bool = False) -> Run:
    try:
        return (run_actionable if acting else run_visible)(user, run_id)
    except RunNotFound:
        raise Http404("no such run") from None


def run_lineage(user, run: Run) -> dict[str, Any]:
    """The run page's lineage panel: the run this one was forked from or
    replays (if `user` may see it), its forks and its replays, and whether
    `user` may fork or replay it."""
    origin = None
    came_from = run.forked_from_id or run.replay_of_id
    if came_from is not None:
        row = scoped_one(Run.objects.select_related("agent"), user, came_from)
        if row is not None:
            origin = {
                "id": str(row.id),
                "status": row.status,
                "kind": "fork" if run.forked_from_id else "replay",
                "step": run.forked_from_step,
            }
    mine = runs_visible_to(user).order_by("created_at", "id")
    forks = [
        {"id": str(f.id), "status": f.status, "step": f.forked_from_step, "version": f.agent_version}
        for f in mine.filter(forked_from_id=run.id)[:SHOWN]
    ]
    replays = [
        {"id": str(r.id), "status": r.status, "version": r.agent_version}
        for r in mine.filter(replay_of_id=run.id)[:SHOWN]
    ]
    acts = in_scope(user, run.tenant_id, acting=True) and run.parent_id is None
    return {
        "origin": origin,
        "forks": forks,
        "replays": replays,
        "can_fork": acts,
        "can_replay": acts and run.status in TERMINAL,
        "steps": list(range(run.step_count or 0, -1, -1)),
    }


@login_required
@require_POST
def run_fork_view(request, run_id):
    """Fork the run after the step the form names; on to the fork's page (or back, with the refusal)."""
    run = _run_or_404(request.user, run_id, acting=True)
    raw = request.POST.get("from_step", "")
    try:
        fork = run_fork(
            run=run,
            from_step=int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 10 else raw,
            input=request.POST.get("input") or None,
            effects=request.POST.get("effects") or None,
            principal=request.user,
            may_publish=request.user.has_perm(PUBLISH_PERMISSION),
        )
    except RunError as exc:
        messages.error(request, exc.message)
        return HttpResponseRedirect(reverse("run-detail", args=[run.id]))
    messages.success(request, f"Forked from step {fork.forked_from_step}: its side effects wait for your approval.")
    return HttpResponseRedirect(reverse("run-detail", args=[fork.id]))


@login_required
@require_POST
def run_replay_view(request, run_id):
    run = _run_or_404(request.user, run_id, acting=True)
    try:
        replay = run_replay(run=run, agent_version=request.POST.get("agent_version") or None, principal=request.user)
    except RunError as exc:
        messages.error(request, exc.message)
        return HttpResponseRedirect(reverse("run-detail", args=[run.id]))
    messages.success(request, "Replay started: it calls the model again and executes no tool call.")
    return HttpResponseRedirect(reverse("run-detail", args=[replay.id]))


@login_required
@require_GET
def run_compare_page(request, run_id, other_id):
    compared = run_compare(a=_run_or_404(request.user, run_id), b=_run_or_404(request.user, other_id))
    for step in compared["steps"]:
        for side in ("a", "b"):
            for call in (step[side] or {}).get("calls", []):
                call["arguments_shown"] = _shown(call["arguments"])
                call["result_shown"] = _shown(call["result"])
    return render(request, "runs/compare.html", compared)


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
