"""The Django admin over runs: read-only views; every change goes through a service.

Scoping comes from runs.services.scoping: a staff user sees its own tenant's rows
(another tenant's is 404), a superuser sees every tenant but its actions
(cancel, resume) apply only in its own. Cancel and resume need
`runs.cancel_run` / `runs.resume_run` and a confirmation page, like the
approval actions. The auth, django-q2, knox and axes admins are superuser-only.
"""

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Q
from django.http import Http404
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from runs.errors import InvalidInput, RunError
from runs.models import Agent, AgentVersion, Event, Run, Tenant, ToolInvocation
from runs.runtime.resume import run_resume
from runs.services import policy_floor_check, scoping, tenant_configure
from runs.services.allowlists import names_check
from runs.services.lifecycle import run_cancel, run_retry


class ScopedAdmin(admin.ModelAdmin):
    """Lists narrowed by runs.services.scoping.scope; one object (the change,
    history and action pages) read by its key alone and its tenant checked
    on the row (scoping.scoped_one: a plan that does not depend on the
    statistics). Subclasses add their joins in `unscoped_queryset`."""

    scope_field = "tenant_id"

    def unscoped_queryset(self, request):
        return super().get_queryset(request)

    def get_queryset(self, request):
        return scoping.scope(self.unscoped_queryset(request), request.user, field=self.scope_field)

    def get_object(self, request, object_id, from_field=None):
        if from_field is not None:
            return super().get_object(request, object_id, from_field)
        try:
            key = self.model._meta.pk.to_python(object_id)
        except (ValidationError, ValueError):
            return None
        return scoping.scoped_one(self.unscoped_queryset(request), request.user, key, field=self.scope_field)


class TenantScoped(ScopedAdmin):
    """Staff see only their own tenant's rows (another tenant's is 404); a superuser sees all."""

    def has_add_permission(self, request):
        return False

    def change_view(self, request, object_id, form_url="", extra_context=None):
        if self.get_object(request, object_id) is None:  # another tenant's row is 404, not a redirect
            raise Http404("not found")
        return super().change_view(request, object_id, form_url, extra_context)

    def has_delete_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def acting_only(self, request, queryset):
        """The selection, if every row is in the user's own tenant; 404 otherwise (a superuser acts only in its own)."""
        allowed = scoping.scoped_all(self.model.objects.all(), request.user, queryset.values_list("pk", flat=True))
        if allowed is None:
            raise Http404("not found")
        return allowed


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
    fields = (
        "step_number",
        "call_index",
        "tool_name",
        "status",
        "outcome",
        "arguments",
        "result",
        "error",
        "effect_sent_at",
        "attempt",
        "attempts",
    )
    readonly_fields = fields
    ordering = ("step_number", "call_index")
    extra = 0
    can_delete = False
    max_num = 0


RUN_ACTIONS = {
    "cancel_runs": (
        "Cancel runs",
        "Cancelling ends a queued or waiting run at once and asks a running one to stop.",
        "Yes, cancel",
    ),
    "resume_runs": (
        "Resume runs",
        "Resuming takes over a RUNNING run whose lease expired (its worker died).",
        "Yes, resume",
    ),
    "retry_runs": (
        "Retry failed runs",
        "Retrying gives a run that failed for a transient reason (dependency_unavailable, internal_error, "
        "max_attempts_exceeded) a new attempt from its last checkpoint; recorded tool results are not sent again.",
        "Yes, retry",
    ),
}


@admin.register(Run)
class RunAdmin(TenantScoped):
    list_display = ("id", "agent", "status", "step_count", "failure_reason", "cost", "parent_link", "created_at")
    list_filter = ("status",)
    search_fields = ("id", "parent__id")
    readonly_fields = [f.name for f in Run._meta.fields] + ["parent_link", "children_links", "lineage_links"]
    inlines = [InvocationInline, EventInline]

    def unscoped_queryset(self, request):
        return super().unscoped_queryset(request).select_related("agent")

    @admin.display(description="parent run")
    def parent_link(self, obj):
        if obj.parent_id is None:
            return "-"
        return format_html('<a href="{}">{}</a>', reverse("admin:runs_run_change", args=[obj.parent_id]), obj.parent_id)

    @admin.display(description="child runs")
    def children_links(self, obj):
        """The child runs this run started, each a link to its page here, with its agent and status
        (a child is in its parent's tenant, which the page was already scoped to)."""
        items = ""  # format_html keeps what it already made safe and escapes the rest
        for child in obj.children.select_related("agent").order_by("created_at", "id"):
            link = reverse("admin:runs_run_change", args=[child.id])
            items = format_html(
                '{}<li><a href="{}">{}</a> {} {}</li>', items, link, child.id, child.agent.name, child.status
            )
        return format_html("<ul>{}</ul>", items) if items else "-"

    @admin.display(description="lineage")
    def lineage_links(self, obj):
        """The run this one was forked from or replays and the runs forked from it or replaying it, each a link to
        its page here and to the two runs compared on the live page (one tenant's runs: the page's scope)."""
        related = []  # (role, the related run, the pair compared: original first)
        if obj.forked_from_id or obj.replay_of_id:
            origin = obj.forked_from_id or obj.replay_of_id
            related.append(("forked from" if obj.forked_from_id else "replays", origin, (origin, obj.id)))
        later = Run.objects.filter(Q(forked_from_id=obj.id) | Q(replay_of_id=obj.id)).order_by("created_at", "id")
        for rid, forked in later.values_list("id", "forked_from_id"):
            related.append(("fork" if forked == obj.id else "replay", rid, (obj.id, rid)))
        items = ""
        for role, rid, pair in related:
            change, compare = reverse("admin:runs_run_change", args=[rid]), reverse("run-compare", args=pair)
            items = format_html(
                '{}<li>{} <a href="{}">{}</a> · <a href="{}">compare</a></li>', items, role, change, rid, compare
            )
        return format_html("<ul>{}</ul>", items) if items else "-"

    actions = ["cancel_runs", "resume_runs", "retry_runs"]

    @admin.display(description="failure")
    def failure_reason(self, obj):
        return (obj.failure or {}).get("reason", "")

    @admin.display(description="cost (USD)")
    def cost(self, obj):
        return format_html("{}", (obj.usage or {}).get("cost_usd", 0))

    def has_cancel_permission(self, request):
        return request.user.is_active and request.user.has_perm("runs.cancel_run")

    def has_resume_permission(self, request):
        return request.user.is_active and request.user.has_perm("runs.resume_run")

    def _confirm(self, request, queryset, action):
        """The confirmation page, or (after "yes") the checked selection to act on."""
        if not getattr(self, f"has_{action.split('_')[0]}_permission")(request):
            raise PermissionDenied  # actions are filtered by permission; a forged POST still stops here
        queryset = self.acting_only(request, queryset)
        if request.POST.get("confirm") == "yes":
            return None, queryset
        title, notice, button = RUN_ACTIONS[action]
        context = {
            **self.admin_site.each_context(request),
            "title": title,
            "notice": notice,
            "button": button,
            "runs": list(queryset.select_related("agent")),
            "action": action,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/runs/run/action_confirm.html", context), None

    @admin.action(description="Cancel selected runs", permissions=["cancel"])
    def cancel_runs(self, request, queryset):
        page, runs = self._confirm(request, queryset, "cancel_runs")
        if page is not None:
            return page
        for run in runs:
            try:
                after = run_cancel(
                    run=run, by=request.user.get_username(), via="admin", reason=request.POST.get("reason")
                )
                if after == "WAITING_FOR_APPROVAL":
                    self.message_user(
                        request,
                        f"{run.id}: cancel requested; it waits on an unknown outcome and ends once someone "
                        "confirms or rejects it",
                    )
                else:
                    self.message_user(request, f"{run.id}: cancel requested")
            except RunError as exc:
                self.message_user(request, f"{run.id}: {exc.message}", messages.WARNING)
        return None

    def has_retry_permission(self, request):
        return self.has_resume_permission(request)  # a retry is a resume of a failed run: the same operators

    @admin.action(description="Retry selected failed runs (transient failures only)", permissions=["retry"])
    def retry_runs(self, request, queryset):
        page, runs = self._confirm(request, queryset, "retry_runs")
        if page is not None:
            return page
        for run in runs:
            try:
                after = run_retry(run=run, by=request.user.get_username(), via="admin")
                self.message_user(request, f"{run.id}: retried, now {after}")
            except RunError as exc:
                self.message_user(request, f"{run.id}: {exc.message}", messages.WARNING)
        return None

    @admin.action(description="Resume selected runs (expired leases only)", permissions=["resume"])
    def resume_runs(self, request, queryset):
        page, runs = self._confirm(request, queryset, "resume_runs")
        if page is not None:
            return page
        for run in runs:
            try:
                outcome = run_resume(run_id=run.id, via="admin")
                self.message_user(request, f"{run.id}: {outcome}")
            except RunError as exc:
                self.message_user(request, f"{run.id}: {exc.message}", messages.WARNING)
        return None


@admin.register(Agent)
class AgentAdmin(TenantScoped):
    list_display = ("name", "tenant", "latest_version", "updated_at")
    readonly_fields = [f.name for f in Agent._meta.fields]


@admin.register(AgentVersion)
class AgentVersionAdmin(TenantScoped):
    list_display = ("agent", "version", "published_by", "published_at", "created_at")
    readonly_fields = [f.name for f in AgentVersion._meta.fields]


class TenantForm(forms.ModelForm):
    class Meta:
        model = Tenant
        fields = ("name", "policy_floor", "max_active_runs", "allowed_tools", "allowed_endpoints")
        help_texts = {
            "policy_floor": (
                'Agent policy shape, e.g. {"default": "allow", "rules": [{"tool": "*", "side_effect": true, '
                '"decision": "require_approval"}]}. Each call gets the stricter of this and the agent\'s policy.'
            ),
            "max_active_runs": "Active runs allowed at once; empty: AGENTRT_MAX_ACTIVE_RUNS.",
            "allowed_tools": (
                'The only tools this tenant\'s agents may use, e.g. ["echo", "http_get"]; empty (null): every tool. '
                "Checked when an agent is published and at every call (a call of another tool fails "
                "tool_not_allowed, never run)."
            ),
            "allowed_endpoints": (
                'The only model endpoints its agents may name, e.g. ["openai"]; empty (null): every endpoint. '
                "A run whose agent names another fails endpoint_not_allowed before the model is called."
            ),
        }

    def clean_policy_floor(self):
        try:
            return policy_floor_check(self.cleaned_data.get("policy_floor"))
        except InvalidInput as exc:
            raise forms.ValidationError(
                [f"{k}: {'; '.join(v)}" for k, v in exc.fields.items()] or exc.message
            ) from None

    def _names(self, field: str, kind: str):
        try:
            return names_check(self.cleaned_data.get(field), kind)
        except InvalidInput as exc:
            raise forms.ValidationError(exc.fields.get(field) or exc.message) from None

    def clean_allowed_tools(self):
        return self._names("allowed_tools", "tools")

    def clean_allowed_endpoints(self):
        return self._names("allowed_endpoints", "endpoints")


@admin.register(Tenant)
class TenantAdmin(ScopedAdmin):
    """Superusers manage tenants (quota, name, allowed tools and endpoints); a user with
    runs.change_tenant edits its own tenant's policy floor and sees its allow-lists."""

    form = TenantForm
    list_display = ("name", "max_active_runs", "created_at")
    scope_field = "id"

    def has_module_permission(self, request):
        return request.user.is_superuser or self.has_change_permission(request) or self.has_view_permission(request)

    def has_add_permission(self, request):
        return request.user.is_superuser

    def has_delete_permission(self, request, obj=None):
        return False  # a tenant's runs and events go with it: not a click in the admin

    def get_readonly_fields(self, request, obj=None):
        if request.user.is_superuser:
            return ()
        # A quota and the allow-lists are set by the platform's operator, not by the tenant.
        return ("name", "max_active_runs", "allowed_tools", "allowed_endpoints")

    def change_view(self, request, object_id, form_url="", extra_context=None):
        if self.get_object(request, object_id) is None:
            raise Http404("not found")
        return super().change_view(request, object_id, form_url, extra_context)

    def save_model(self, request, obj, form, change):
        if not change:
            return super().save_model(request, obj, form, change)
        changes = {"policy_floor": form.cleaned_data["policy_floor"]}
        if request.user.is_superuser:
            changes.update(
                name=form.cleaned_data["name"],
                max_active_runs=form.cleaned_data["max_active_runs"],
                allowed_tools=form.cleaned_data["allowed_tools"],
                allowed_endpoints=form.cleaned_data["allowed_endpoints"],
            )
        tenant_configure(tenant=obj, **changes)


def _superuser_only(model_admin_class):
    """A subclass of an admin that only superusers can see or use."""

    def only_superuser(self, request, *args, **kwargs):
        return bool(request.user.is_active and request.user.is_superuser)

    return type(
        f"SuperuserOnly{model_admin_class.__name__}",
        (model_admin_class,),
        {
            name: only_superuser
            for name in (
                "has_module_permission",
                "has_view_permission",
                "has_change_permission",
                "has_add_permission",
                "has_delete_permission",
            )
        },
    )


def restrict_to_superusers(site=admin.site, app_labels=("auth", "django_q", "knox", "axes")) -> None:
    """Re-register the auth (User, Group), django-q2, API-token (knox) and
    login-attempt (axes) admins as superuser-only: they span every tenant."""
    for model, model_admin in list(site._registry.items()):
        if model._meta.app_label in app_labels:
            site.unregister(model)
            site.register(model, _superuser_only(type(model_admin)))


restrict_to_superusers()
