"""The approval console: pending approvals first; decisions go through the
approval service with the hash the page displayed."""
from django.contrib import admin, messages
from django.utils.html import format_html

from runs.admin import TenantScoped

from .errors import ApprovalError
from .models import Approval
from .services import approval_decide, can_resolve


@admin.register(Approval)
class ApprovalAdmin(TenantScoped):
    list_display = ("id", "kind", "tool", "status", "run_link", "created_at", "expires_at")
    list_filter = ("status", "kind")
    ordering = ("-created_at",)
    readonly_fields = [f.name for f in Approval._meta.fields]
    actions = ["approve_selected", "reject_selected"]

    @admin.display(description="tool")
    def tool(self, obj):
        return (obj.presentation or {}).get("tool", "")

    @admin.display(description="run")
    def run_link(self, obj):
        return format_html('<a href="/admin/runs/run/{}/change/">{}</a>', obj.run_id, obj.run_id)

    def has_resolve_permission(self, request):
        return can_resolve(request.user)

    def _decide(self, request, queryset, approve):
        for approval in queryset:
            try:
                approval_decide(user=request.user, approval_id=approval.id, approve=approve,
                                request_hash=approval.request_hash, via="admin")
            except ApprovalError as exc:
                self.message_user(request, f"{approval.id}: {exc.message}", messages.WARNING)

    @admin.action(description="Approve selected (runs the call)", permissions=["resolve"])
    def approve_selected(self, request, queryset):
        self._decide(request, queryset, True)

    @admin.action(description="Reject selected", permissions=["resolve"])
    def reject_selected(self, request, queryset):
        self._decide(request, queryset, False)
