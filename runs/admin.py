"""The Django admin over runs: read-only views; every change goes through a service."""
from django.contrib import admin, messages
from django.utils.html import format_html

from .lifecycle import run_cancel
from .models import Agent, AgentVersion, Event, Membership, Run, Tenant, ToolInvocation
from .resume import run_resume


class TenantScoped(admin.ModelAdmin):
    """Non-superusers see only their own tenant's rows (another tenant's is 404)."""

    def get_queryset(self, request):
        qs = super().get_queryset(request)
        if request.user.is_superuser:
            return qs
        membership = Membership.objects.filter(user=request.user).first()
        return qs.filter(tenant_id=membership.tenant_id) if membership else qs.none()

    def has_add_permission(self, request):
        return False

    def change_view(self, request, object_id, form_url="", extra_context=None):
        from django.http import Http404

        if self.get_object(request, object_id) is None:  # another tenant's row is 404, not a redirect
            raise Http404("not found")
        return super().change_view(request, object_id, form_url, extra_context)

    def has_delete_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class EventInline(admin.TabularInline):
    model = Event
    fields = ("sequence", "type", "payload", "lease_epoch", "occurred_at")
    readonly_fields = fields
    ordering = ("sequence",)
    extra = 0
    can_delete = False
    max_num = 0
    show_change_link = False


class InvocationInline(admin.TabularInline):
    model = ToolInvocation
    fields = ("step_number", "call_index", "tool_name", "status", "outcome", "arguments", "result", "error", "effect_sent_at", "attempt", "attempts")
    readonly_fields = fields
    ordering = ("step_number", "call_index")
    extra = 0
    can_delete = False
    max_num = 0


@admin.register(Run)
class RunAdmin(TenantScoped):
    list_display = ("id", "agent", "status", "step_count", "failure_reason", "cost", "created_at")
    list_filter = ("status",)
    search_fields = ("id",)
    readonly_fields = [f.name for f in Run._meta.fields]
    inlines = [InvocationInline, EventInline]
    actions = ["cancel_runs", "resume_runs"]

    @admin.display(description="failure")
    def failure_reason(self, obj):
        return (obj.failure or {}).get("reason", "")

    @admin.display(description="cost (USD)")
    def cost(self, obj):
        return format_html("{}", (obj.usage or {}).get("cost_usd", 0))

    @admin.action(description="Cancel selected runs", permissions=["view"])
    def cancel_runs(self, request, queryset):
        for run in queryset:
            try:
                run_cancel(run=run, by=request.user.get_username())
            except Exception as exc:
                self.message_user(request, f"{run.id}: {getattr(exc, 'message', 'cannot cancel')}", messages.WARNING)

    @admin.action(description="Resume selected runs (expired leases only)", permissions=["view"])
    def resume_runs(self, request, queryset):
        for run in queryset:
            try:
                outcome = run_resume(run_id=run.id, via="admin")
                self.message_user(request, f"{run.id}: {outcome}")
            except Exception as exc:
                self.message_user(request, f"{run.id}: {getattr(exc, 'message', 'cannot resume')}", messages.WARNING)


@admin.register(Agent)
class AgentAdmin(TenantScoped):
    list_display = ("name", "tenant", "latest_version", "updated_at")
    readonly_fields = [f.name for f in Agent._meta.fields]


@admin.register(AgentVersion)
class AgentVersionAdmin(TenantScoped):
    list_display = ("agent", "version", "created_at")
    readonly_fields = [f.name for f in AgentVersion._meta.fields]


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("name", "created_at")

    def has_module_permission(self, request):
        return request.user.is_superuser
