"""The approval console in the Django admin.

Pending approvals first, newest first. Approve and reject — and, for an
unknown outcome, confirm (took effect / did not) — are admin actions
with a confirmation page and buttons on the change page; all post the
request hash the page displayed, and both go through the one approval
service — so an operator approves exactly what was shown, and a user
without `approvals.resolve_approval` changes nothing, whatever they post.
"""

import json

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.timesince import timesince, timeuntil

from approvals.errors import ApprovalError
from approvals.models import CONFIRMABLE_KINDS, UNKNOWN_OUTCOME_KINDS, Approval
from approvals.services import approval_confirm, approval_decide, can_resolve
from approvals.unknown import deadline_passed, decisions_open, ends_run
from runs.admin import TenantScoped
from runs.clock import CLOCK
from runs.services.scoping import in_scope


class PendingFirst(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request, model_admin):
        return [("pending", "pending"), ("all", "all")] + [(s, s) for s, _ in Approval.STATUSES if s != "pending"]

    def choices(self, changelist):
        value = self.value() or "pending"
        for lookup, title in self.lookup_choices:
            yield {
                "selected": value == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }

    def queryset(self, request, queryset):
        value = self.value() or "pending"
        return queryset if value == "all" else queryset.filter(status=value)


class DeadlinePassed(admin.SimpleListFilter):
    """The runs whose deadline has passed: with `pending`, the unknown outcomes that wait past it for a confirm
    or a reject (approve is refused then; the decision ends the run)."""

    title = "run deadline"
    parameter_name = "deadline"

    def lookups(self, request, model_admin):
        return [("passed", "passed"), ("not_passed", "not passed")]

    def queryset(self, request, queryset):
        passed = Q(run__deadline_at__isnull=False, run__deadline_at__lte=CLOCK.now())
        if self.value() == "passed":
            return queryset.filter(passed)
        if self.value() == "not_passed":
            return queryset.exclude(passed)
        return queryset


@admin.register(Approval)
class ApprovalAdmin(TenantScoped):
    list_display = (
        "created_at",
        "tool",
        "kind",
        "side_effect",
        "arguments_short",
        "run_link",
        "step",
        "waiting",
        "expires",
        "deadline",
        "status",
    )
    list_filter = (PendingFirst, "kind", DeadlinePassed)
    list_select_related = ("run", "invocation")
    ordering = ("-created_at",)
    readonly_fields = (
        "id",
        "kind",
        "status",
        "tool",
        "side_effect",
        "server_hints",
        "arguments_pretty",
        "notice",
        "run_link",
        "step",
        "request_hash",
        "waiting",
        "expires",
        "deadline",
        "decided_by",
        "decided_at",
        "decided_via",
        "reason",
        "capability",
    )
    fields = readonly_fields
    actions = ["approve_selected", "reject_selected", "confirm_took_effect_selected", "confirm_not_taken_selected"]
    change_form_template = "admin/approvals/approval/change_form.html"

    # -- columns ---------------------------------------------------------
    @admin.display(description="tool")
    def tool(self, obj):
        return (obj.presentation or {}).get("tool", "")

    @admin.display(description="side effect")
    def side_effect(self, obj):
        return (obj.presentation or {}).get("side_effect", "")

    @admin.display(description="MCP server's hints")
    def server_hints(self, obj):
        """An MCP tool's server and its annotations as pinned: hints, never what decides (runs.tools.mcp)."""
        mcp = (obj.presentation or {}).get("mcp")
        if not isinstance(mcp, dict):
            return "-"
        return format_html(
            "server {}, tool {}: {} <em>(hints from the server, not trusted; the operator classified this tool)</em>",
            mcp.get("server", ""),
            mcp.get("tool", ""),
            json.dumps(mcp.get("server_hints") or {}, sort_keys=True, ensure_ascii=False),
        )

    @admin.display(description="notice")
    def notice(self, obj):
        return (obj.presentation or {}).get("notice", "")

    @admin.display(description="arguments")
    def arguments_short(self, obj):
        text = json.dumps((obj.presentation or {}).get("arguments"), ensure_ascii=False)
        return text if len(text) <= 80 else text[:77] + "..."

    @admin.display(description="arguments")
    def arguments_pretty(self, obj):
        return format_html(
            "<pre>{}</pre>",
            json.dumps((obj.presentation or {}).get("arguments"), indent=2, sort_keys=True, ensure_ascii=False),
        )

    @admin.display(description="run")
    def run_link(self, obj):
        return format_html(
            '<a href="{}">{}</a> · <a href="/runs/{}/">live</a>',
            reverse("admin:runs_run_change", args=[obj.run_id]),
            str(obj.run_id)[:8],
            obj.run_id,
        )

    @admin.display(description="step")
    def step(self, obj):
        return obj.invocation.step_number if obj.invocation_id else ""

    @admin.display(description="waiting")
    def waiting(self, obj):
        return timesince(obj.created_at, CLOCK.now()) if obj.status == "pending" else ""

    @admin.display(description="expires in")
    def expires(self, obj):
        if obj.status != "pending":
            return ""
        if obj.kind in UNKNOWN_OUTCOME_KINDS:
            return "never (unknown outcome)"
        if not obj.expires_at:
            return ""
        return timeuntil(obj.expires_at, CLOCK.now()) if obj.expires_at > CLOCK.now() else "expired"

    @admin.display(description="run deadline")
    def deadline(self, obj):
        """Passed (and, for a pending unknown outcome, how the run ends after the decision), or the time left."""
        if obj.run.deadline_at is None:
            return ""
        now = CLOCK.now()
        if not deadline_passed(obj.run, now):
            return f"in {timeuntil(obj.run.deadline_at, now)}"
        ending = ends_run(obj, obj.run, now)
        if ending:
            return format_html("<strong>passed</strong> · confirm or reject; the run then ends {}", ending)
        return "passed"

    # -- permissions -----------------------------------------------------
    def has_resolve_permission(self, request):
        return can_resolve(request.user)

    def has_view_permission(self, request, obj=None):
        return (
            request.user.is_active
            and request.user.is_staff
            and (
                request.user.has_perm("approvals.view_approval") or request.user.has_perm("approvals.resolve_approval")
            )
        )

    # -- decisions ---------------------------------------------------------
    def _decide(self, request, approval_id, approve, shown_hash, reason):
        try:
            approval_decide(
                user=request.user,
                approval_id=approval_id,
                approve=approve,
                request_hash=shown_hash,
                reason=reason,
                via="admin",
            )
        except ApprovalError as exc:
            self.message_user(request, f"{approval_id}: {exc.message}", messages.ERROR)
            return False
        self.message_user(request, f"{approval_id}: {'approved' if approve else 'rejected'}", messages.SUCCESS)
        return True

    def _settle(self, request, approval_id, took_effect, shown_hash, reason):
        """The third decision on an unknown outcome: the operator says whether it took effect."""
        try:
            approval_confirm(
                user=request.user,
                approval_id=approval_id,
                request_hash=shown_hash,
                took_effect=took_effect,
                reason=reason,
                via="admin",
            )
        except ApprovalError as exc:
            self.message_user(request, f"{approval_id}: {exc.message}", messages.ERROR)
            return False
        self.message_user(
            request,
            f"{approval_id}: confirmed ({'took effect' if took_effect else 'did not take effect'})",
            messages.SUCCESS,
        )
        return True

    def _confirm(self, request, queryset, approve, took_effect=None):
        queryset = self.acting_only(request, queryset)  # a superuser decides only in its own tenant: 404 elsewhere
        if request.POST.get("confirm") == "yes":
            reason = request.POST.get("reason", "")
            for approval in queryset:
                shown = request.POST.get(f"hash_{approval.id}", "")
                if took_effect is None:
                    self._decide(request, approval.id, approve, shown, reason)
                else:
                    self._settle(request, approval.id, took_effect, shown, reason)
            return None
        if took_effect is None:
            title, action = (
                ("Approve tool calls", "approve_selected") if approve else ("Reject tool calls", "reject_selected")
            )
        elif took_effect:
            title, action = "Confirm: the calls took effect", "confirm_took_effect_selected"
        else:
            title, action = "Confirm: the calls did not take effect", "confirm_not_taken_selected"
        context = {
            **self.admin_site.each_context(request),
            "title": title,
            "approvals": [
                {
                    "obj": a,
                    "pretty": json.dumps(
                        (a.presentation or {}).get("arguments"), indent=2, sort_keys=True, ensure_ascii=False
                    ),
                }
                for a in queryset
            ],
            "approve": approve,
            "confirming": took_effect is not None,
            "took_effect": took_effect,
            "action": action,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/approvals/approval/decide_confirm.html", context)

    @admin.action(description="Approve selected (runs the call)", permissions=["resolve"])
    def approve_selected(self, request, queryset):
        return self._confirm(request, queryset, True)

    @admin.action(description="Reject selected", permissions=["resolve"])
    def reject_selected(self, request, queryset):
        return self._confirm(request, queryset, False)

    @admin.action(description="Confirm selected: the call took effect (nothing is sent)", permissions=["resolve"])
    def confirm_took_effect_selected(self, request, queryset):
        return self._confirm(request, queryset, False, took_effect=True)

    @admin.action(
        description="Confirm selected: the call did not take effect (nothing is sent)", permissions=["resolve"]
    )
    def confirm_not_taken_selected(self, request, queryset):
        return self._confirm(request, queryset, False, took_effect=False)

    def get_urls(self):
        return [
            path(
                "<path:object_id>/decide/",
                self.admin_site.admin_view(self.decide_view),
                name="approvals_approval_decide",
            )
        ] + super().get_urls()

    def decide_view(self, request, object_id):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        obj = self.get_object(request, object_id)
        if obj is None or not in_scope(request.user, obj.tenant_id, acting=True):
            raise Http404("no such approval")  # a superuser sees every tenant but decides only in its own
        if not can_resolve(request.user):
            raise PermissionDenied
        decision = request.POST.get("decision")
        shown, reason = request.POST.get("request_hash", ""), request.POST.get("reason", "")
        if decision in ("took_effect", "not_taken"):
            self._settle(request, obj.id, decision == "took_effect", shown, reason)
        else:
            self._decide(request, obj.id, decision == "approve", shown, reason)
        return HttpResponseRedirect(reverse("admin:approvals_approval_change", args=[obj.id]))

    def change_view(self, request, object_id, form_url="", extra_context=None):
        obj = self.get_object(request, object_id)
        acting = obj is not None and in_scope(request.user, obj.tenant_id, acting=True)
        offered = decisions_open(obj, obj.run, CLOCK.now()) if obj is not None else []
        extra_context = {
            **(extra_context or {}),
            "can_resolve": can_resolve(request.user) and acting,
            "can_confirm": obj is not None and obj.kind in CONFIRMABLE_KINDS,
            # approve is not offered for an unknown outcome whose run cannot go on (approvals/unknown.py)
            "can_approve": obj is None or obj.status != "pending" or "approve" in offered,
            "ends_run": ends_run(obj, obj.run, CLOCK.now()) if obj is not None else None,
        }
        return super().change_view(request, object_id, form_url, extra_context)
