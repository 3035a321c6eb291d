"""Live pages: adapters that read through selectors and decide through the
services (the approval service with `via="live"`, the lifecycle service)."""

from __future__ import annotations

from csp.decorators import csp_update
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponseRedirect, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from approvals.errors import ApprovalError
from approvals.models import Approval
from approvals.services import approval_confirm, approval_decide, can_resolve
from approvals.unknown import deadline_passed, decisions_open, ends_run
from runs.clock import CLOCK
from runs.domain.events import page_vocabulary
from runs.domain.pipeline import MAX_DELEGATION_DEPTH
from runs.domain.values import ApprovalStatus
from runs.errors import RunError, RunNotFound
from runs.models import Run
from runs.services.lifecycle import run_cancel, run_retry
from runs.services.run_list import run_summary
from runs.services.scoping import as_uuid, in_scope, run_actionable, run_visible, runs_visible_to, scoped_one
from runs.services.selectors import run_to_dict
from runs.web.lineage import run_lineage

# The live pages' own scripts build nodes and set text only, so the browser may refuse every string-to-markup
# sink there (Trusted Types): an innerHTML with data, added later by mistake, throws instead of rendering.
LIVE_PAGE_CSP = {"require-trusted-types-for": ["'script'"], "trusted-types": ["'none'"]}


def _run_or_404(user, run_id, *, acting: bool = False) -> Run:
    """A run `user` may see (with `acting`: act on — its own tenant only); 404 otherwise."""
    try:
        return (run_actionable if acting else run_visible)(user, run_id)
    except RunNotFound:
        raise Http404("no such run") from None


@csp_update(LIVE_PAGE_CSP)
@login_required
def run_detail(request, run_id):
    run = _run_or_404(request.user, run_id)
    summary = run_summary(run)  # first: it reads the history's end, then the run again (the page's status)
    pending = list(Approval.objects.filter(run=run, status__unindexed=ApprovalStatus.PENDING))
    now = CLOCK.now()
    # Plain data: the template hands it to the page's script only through `json_script`, never raw inside a <script>.
    return render(
        request,
        "runs/detail.html",
        {
            "run": run_to_dict(run),
            "pending": [
                {
                    "id": str(a.id),
                    "kind": a.kind,
                    "request_hash": a.request_hash,
                    "presentation": a.presentation,
                    "expires_at": a.expires_at.isoformat() if a.expires_at else None,
                    # an unknown outcome past its run's deadline (or budget, or cancelled): confirm or reject only
                    "deadline_passed": deadline_passed(run, now),
                    "decisions": decisions_open(a, run, now),
                    "ends_run": ends_run(a, run, now),
                }
                for a in pending
            ],
            "can_resolve": can_resolve(request.user) and in_scope(request.user, run.tenant_id, acting=True),
            # Actions are drawn only where they apply, and follow the run live (runs/static/runs/detail.js).
            "summary": summary,
            "can_act": in_scope(request.user, run.tenant_id, acting=True),
            "event_types": page_vocabulary(),
            "ancestors": _ancestors(request.user, run),
            "tree": _descendants(request.user, run),
            "lineage": run_lineage(request.user, run),
        },
    )


@login_required
@require_GET
def run_summary_view(request, run_id):
    """The run page's live figures (status, steps, usage, cost, whether a cancel applies), read again
    when its socket brings an event that may have changed them."""
    return JsonResponse(run_summary(_run_or_404(request.user, run_id)))


RETRY_UNKNOWN_OUTCOME = (
    "Retry started. A side effect of the failed attempt has an unknown outcome: the run waits until someone "
    "confirms whether it took effect, or decides to run it again."
)
OPEN_QUESTION_CANCEL = (
    "Cancel requested. The run waits on a call whose outcome is unknown: it ends as soon as someone confirms "
    "whether the call took effect, or rejects it (it is not sent again)."
)
TREE_LEVELS = MAX_DELEGATION_DEPTH + 1  # how far down the run page draws the tree of child runs
INPUT_PREVIEW = 120


def _node(run: Run, depth: int) -> dict:
    return {
        "id": str(run.id),
        "agent": run.agent.name,
        "version": run.agent_version[:10],  # the version pinned when the child started
        "status": run.status,
        "input": run.input[:INPUT_PREVIEW] + ("…" if len(run.input) > INPUT_PREVIEW else ""),
        "depth": depth,
    }


def _ancestors(user, run: Run) -> list[dict]:
    """The runs above `run`, from the one a person submitted down to its parent."""
    chain: list[dict] = []
    parent_id = run.parent_id
    while parent_id is not None and len(chain) < TREE_LEVELS:
        parent = scoped_one(Run.objects.select_related("agent"), user, parent_id)
        if parent is None:
            break
        chain.insert(0, _node(parent, 0))
        parent_id = parent.parent_id
    return chain


def _descendants(user, run: Run) -> list[dict]:
    """The tree of runs below `run`, flattened depth-first (each row's `depth`
    from 1): one query per level."""
    below: dict = {}
    level = [run.id]
    for _ in range(TREE_LEVELS):
        rows = list(runs_visible_to(user).filter(parent_id__in=level).order_by("created_at", "id"))
        if not rows:
            break
        for row in rows:
            below.setdefault(row.parent_id, []).append(row)
        level = [row.id for row in rows]
    out: list[dict] = []

    def walk(parent_id, depth: int) -> None:
        for child in below.get(parent_id, []):
            out.append(_node(child, depth))
            walk(child.id, depth + 1)

    walk(run.id, 1)
    return out


@login_required
@require_POST
def run_decide(request, run_id):
    run = _run_or_404(request.user, run_id, acting=True)
    approval = (
        Approval.objects.filter(run=run, id=request.POST.get("approval", "")).first()
        if as_uuid(request.POST.get("approval"))
        else None
    )
    if approval is None:
        raise Http404("no such approval")
    decision = request.POST.get("decision")
    try:
        if decision in ("took_effect", "not_taken"):  # an unknown outcome the operator knows: nothing is sent again
            approval_confirm(
                user=request.user,
                approval_id=approval.id,
                request_hash=request.POST.get("request_hash", ""),
                took_effect=decision == "took_effect",
                reason=request.POST.get("reason", ""),
                via="live",
            )
        else:
            approval_decide(
                user=request.user,
                approval_id=approval.id,
                approve=decision == "approve",
                request_hash=request.POST.get("request_hash", ""),
                reason=request.POST.get("reason", ""),
                via="live",
            )
        messages.success(request, "Decision recorded.")
    except (ApprovalError, RunError) as exc:
        messages.error(request, exc.message)
    return HttpResponseRedirect(reverse("run-detail", args=[run.id]))


@login_required
@require_POST
def run_cancel_view(request, run_id):
    run = _run_or_404(request.user, run_id, acting=True)
    try:
        after = run_cancel(run=run, by=request.user.get_username(), via="live", reason=request.POST.get("reason"))
        if after == "WAITING_FOR_APPROVAL":
            messages.success(request, OPEN_QUESTION_CANCEL)
        else:
            messages.success(request, "Cancel requested.")
    except RunError as exc:
        messages.error(request, exc.message)
    return HttpResponseRedirect(reverse("run-detail", args=[run.id]))


@login_required
@require_POST
def run_retry_view(request, run_id):
    run = _run_or_404(request.user, run_id, acting=True)
    try:
        if run_retry(run=run, by=request.user.get_username(), via="live") == "WAITING_FOR_APPROVAL":
            messages.success(request, RETRY_UNKNOWN_OUTCOME)
        else:
            messages.success(request, "Retry started: the run continues from its last checkpoint.")
    except RunError as exc:
        messages.error(request, exc.message)
    return HttpResponseRedirect(reverse("run-detail", args=[run.id]))
