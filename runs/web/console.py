"""The operator's pages beside the run page: the runs list (filters, search,
keyset paging), the inbox of approvals waiting for a decision, and the small
JSON reads their scripts refresh from as the tenant's socket says something
changed. Reads only, through runs.services.run_list and approvals.selectors
(both start from runs.services.scoping)."""

from __future__ import annotations

from csp.decorators import csp_update
from django.contrib.auth.decorators import login_required
from django.http import JsonResponse
from django.shortcuts import render
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from approvals.selectors import INBOX_LIMIT, approval_card, approvals_waiting, waiting_count
from runs.domain.events import page_vocabulary
from runs.errors import InvalidInput
from runs.models import Tenant
from runs.services import scoping
from runs.services.run_list import (
    PAGE_SIZE,
    SEARCH_WINDOW,
    STATUSES,
    WAITING_LABELS,
    RunFilters,
    run_filters_from,
    run_page,
    run_rows,
    runs_filtered,
    with_tenants,
)
from runs.services.scoping import as_uuid
from runs.services.selectors import with_children

LIVE_PAGE_CSP = {"require-trusted-types-for": ["'script'"], "trusted-types": ["'none'"]}
SINCE_CHOICES = [("", "any time"), ("15m", "last 15 min"), ("1h", "last hour"), ("24h", "last 24 h")]
SINCE_CHOICES += [("7d", "last 7 days"), ("30d", "last 30 days")]
FILTER_KEYS = ("status", "agent", "waiting_on", "tenant", "since", "created_after", "created_before", "q")
MAX_ROWS_ASKED = 50


def _filters(request) -> tuple[RunFilters, str | None]:
    """The page's filters, or none and the message naming the one at fault."""
    try:
        return run_filters_from(request.GET, blank=True), None
    except InvalidInput as exc:
        return RunFilters(), exc.message


def _agent_names(user) -> list[str]:
    names = scoping.agents_visible_to(user).order_by("name").values_list("name", flat=True).distinct()
    return list(names[:500])


@csp_update(LIVE_PAGE_CSP)
@login_required
def runs_list(request):
    filters, error = _filters(request)
    every_tenant = scoping.sees_every_tenant(request.user)
    qs = with_children(runs_filtered(user=request.user, filters=filters))
    if every_tenant:
        qs = with_tenants(qs)
    try:
        page = run_page(qs, cursor=None if error else request.GET.get("cursor"), limit=PAGE_SIZE)
    except InvalidInput as exc:
        error, page = exc.message, run_page(qs, limit=PAGE_SIZE)
    given = {k: request.GET.get(k, "") for k in FILTER_KEYS}
    kept = {k: v for k, v in given.items() if v}
    return render(
        request,
        "runs/list.html",
        {
            "runs": run_rows(page.runs, with_tenant=every_tenant),
            "older": "?" + urlencode({**kept, "cursor": page.older}) if page.older else None,
            "newer": "?" + urlencode({**kept, "cursor": page.newer}) if page.newer else None,
            "first_page": not request.GET.get("cursor") or error is not None,
            "given": given,
            "error": error,
            "statuses": STATUSES,
            "waiting_choices": list(WAITING_LABELS.items()),
            "since_choices": SINCE_CHOICES,
            "agents": _agent_names(request.user),
            "tenants": list(Tenant.objects.order_by("name").values_list("name", flat=True)[:500])
            if every_tenant
            else [],
            "every_tenant": every_tenant,
            "search_window": SEARCH_WINDOW,
            "page_filters": kept,
            "event_types": page_vocabulary(),
        },
    )


@login_required
@require_GET
def runs_rows(request):
    """The rows of the runs the page asks about (`run`, repeated) that pass its filters, as the page shows them:
    how a live page learns whether a run it has just heard of belongs on it."""
    try:
        filters = run_filters_from(request.GET, blank=True)
    except InvalidInput as exc:
        return JsonResponse({"code": exc.code, "message": exc.message, "fields": exc.fields}, status=400)
    ids = [key for key in (as_uuid(v) for v in request.GET.getlist("run")[:MAX_ROWS_ASKED]) if key is not None]
    every_tenant = scoping.sees_every_tenant(request.user)
    qs = with_children(runs_filtered(user=request.user, filters=filters).filter(id__in=ids))
    if every_tenant:
        qs = with_tenants(qs)
    runs = list(qs.order_by("-created_at", "-id"))
    return JsonResponse({"rows": run_rows(runs, with_tenant=every_tenant)})


def _inbox(request) -> tuple[list[dict], int, str]:
    tenant = request.GET.get("tenant", "")[:100] if scoping.sees_every_tenant(request.user) else ""
    qs = approvals_waiting(user=request.user, tenant=tenant or None).select_related("run__tenant")
    rows = list(qs[: INBOX_LIMIT + 1])
    return [approval_card(a, with_tenant=bool(tenant)) for a in rows[:INBOX_LIMIT]], len(rows), tenant


@csp_update(LIVE_PAGE_CSP)
@login_required
def approvals_inbox(request):
    cards, found, tenant = _inbox(request)
    every_tenant = scoping.sees_every_tenant(request.user)
    return render(
        request,
        "runs/approvals.html",
        {
            "cards": cards,
            "more": found > INBOX_LIMIT,
            "limit": INBOX_LIMIT,
            "tenant": tenant,
            "tenants": list(Tenant.objects.order_by("name").values_list("name", flat=True)[:500])
            if every_tenant
            else [],
            "every_tenant": every_tenant,
        },
    )


@login_required
@require_GET
def approvals_rows(request):
    cards, found, _ = _inbox(request)
    return JsonResponse({"results": cards, "more": found > INBOX_LIMIT})


@login_required
@require_GET
def approvals_count(request):
    """The header's count: approvals waiting for a decision the user may make."""
    return JsonResponse({"waiting": waiting_count(user=request.user)})
