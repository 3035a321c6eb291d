"""The live pages of a run's lineage: two runs side by side (the compare
page, rendered on the server from the compare selector; every text a model,
a tool or a user wrote goes through the template's escaping)."""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render
from django.views.decorators.http import require_GET

from runs.errors import RunNotFound
from runs.models import Run
from runs.services.compare import run_compare
from runs.services.scoping import run_actionable, run_visible


def _run_or_404(user, run_id, *, acting: bool = False) -> Run:
    try:
        return (run_actionable if acting else run_visible)(user, run_id)
    except RunNotFound:
        raise Http404("no such run") from None


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
