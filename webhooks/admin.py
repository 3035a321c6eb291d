"""The admin over webhook subscriptions and deliveries.

Tenant-scoped like the rest of the admin (runs.services.scoping): staff see their own
tenant's rows, another tenant's is 404; a superuser sees every tenant but
creates, changes, deletes and tests only in its own. Changes go through
webhooks.services; `webhooks.manage_webhooks` is needed for any of them.
A new subscription's secret is shown once, on the page after "Save", and
never again. Deliveries (hooks' and webhooks') are read-only: hook, run,
attempts, last error, status. A URL's path, query and credentials and a
receiver's answer are shown to operators only (webhooks.visibility): staff
without `webhooks.manage_webhooks` see the URL's origin and
`HTTP <code>: [answer hidden: operators only]`.
"""

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from runs.admin import ScopedAdmin, TenantScoped
from runs.errors import RunError
from runs.services import scoping

from . import services, visibility
from .models import EVENT_TYPES, Delivery, WebhookSubscription


class SubscriptionForm(forms.ModelForm):
    url = forms.URLField(max_length=2000, assume_scheme="https")
    event_types = forms.MultipleChoiceField(choices=[(t, t) for t in EVENT_TYPES], widget=forms.CheckboxSelectMultiple)

    class Meta:
        model = WebhookSubscription
        fields = ("url", "event_types", "active", "description")
        help_texts = {"url": "http(s) on a host listed in AGENTRT_WEBHOOK_ALLOWED_HOSTS. Redirects are never followed."}

    def clean(self):
        data = super().clean()
        limit = int(settings.AGENTRT_WEBHOOK_MAX_PER_TENANT)
        tenant = scoping.tenant_for(self.user) if getattr(self, "user", None) else None
        if self.instance._state.adding and tenant is not None:
            if WebhookSubscription.objects.filter(tenant=tenant).count() >= limit:
                raise forms.ValidationError(
                    f"your tenant already has {limit} subscriptions (AGENTRT_WEBHOOK_MAX_PER_TENANT)"
                )
        try:
            services.check_fields(url=data.get("url"), event_types=data.get("event_types"), partial=True)
        except RunError as exc:
            for name, reasons in exc.fields.items():
                self.add_error(name if name in self.fields else None, reasons)
        return data


@admin.register(WebhookSubscription)
class SubscriptionAdmin(ScopedAdmin):
    form = SubscriptionForm
    list_display = ("url", "tenant", "events", "active", "created_at")
    list_filter = ("active",)
    actions = ["send_test_event"]
    change_form_template = "admin/webhooks/webhooksubscription/change_form.html"

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        return type(form.__name__, (form,), {"user": request.user})

    @admin.display(description="event types")
    def events(self, obj):
        return ", ".join(obj.event_types or [])

    @admin.display(description="url")
    def url_masked(self, obj):
        return visibility.masked_url(obj.url)

    def get_list_display(self, request):
        shown = super().get_list_display(request)
        if visibility.sees_secrets(request.user):
            return shown
        return tuple("url_masked" if name == "url" else name for name in shown)

    def get_fields(self, request, obj=None):
        fields = super().get_fields(request, obj)
        if visibility.sees_secrets(request.user):
            return fields
        return list(dict.fromkeys("url_masked" if name == "url" else name for name in fields))

    def get_readonly_fields(self, request, obj=None):
        readonly = tuple(super().get_readonly_fields(request, obj))
        return readonly if visibility.sees_secrets(request.user) else (*readonly, "url_masked")

    def _own(self, request, obj) -> bool:
        tenant = scoping.tenant_for(request.user)
        return tenant is not None and (obj is None or obj.tenant_id == tenant.id)

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and (
            request.user.has_perm("webhooks.view_webhooksubscription") or services.can_manage(request.user)
        )

    def has_add_permission(self, request):
        return services.can_manage(request.user) and self._own(request, None)

    def has_change_permission(self, request, obj=None):
        return services.can_manage(request.user) and self._own(request, obj)

    def has_delete_permission(self, request, obj=None):
        return self.has_change_permission(request, obj)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        obj = self.get_object(request, object_id)
        if obj is None:
            raise Http404("not found")
        extra = {**(extra_context or {}), "can_test": self.has_change_permission(request, obj)}
        return super().change_view(request, object_id, form_url, extra)

    def delete_view(self, request, object_id, extra_context=None):
        if self.get_object(request, object_id) is None:  # another tenant's row is 404, not a redirect
            raise Http404("not found")
        return super().delete_view(request, object_id, extra_context)

    def history_view(self, request, object_id, extra_context=None):
        if self.get_object(request, object_id) is None:
            raise Http404("not found")
        return super().history_view(request, object_id, extra_context)

    def save_model(self, request, obj, form, change):
        data = {k: form.cleaned_data[k] for k in ("url", "event_types", "active", "description")}
        if change:
            services.subscription_update(user=request.user, subscription_id=obj.pk, **data)
            return
        row, secret = services.subscription_create(user=request.user, **data)
        obj.pk, obj.id = row.pk, row.id
        request.agentrt_webhook_secret = secret

    def response_add(self, request, obj, post_url_continue=None):
        secret = getattr(request, "agentrt_webhook_secret", None)
        if secret is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "title": "Webhook subscription created",
            "subscription": obj,
            "secret": secret,
            "opts": self.model._meta,
            "change_url": reverse("admin:webhooks_webhooksubscription_change", args=[obj.pk]),
        }
        response = TemplateResponse(request, "admin/webhooks/webhooksubscription/secret_once.html", context)
        response["Cache-Control"] = "no-store"
        return response

    def delete_model(self, request, obj):
        services.subscription_delete(user=request.user, subscription_id=obj.pk)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            services.subscription_delete(user=request.user, subscription_id=obj.pk)

    @admin.action(description="Send a test event to the selected subscriptions", permissions=["change"])
    def send_test_event(self, request, queryset):
        for obj in queryset:
            self._test(request, obj)

    def _test(self, request, obj) -> None:
        try:
            delivery = services.send_test(user=request.user, subscription_id=obj.pk)
        except RunError as exc:
            if exc.status == 404:
                raise Http404("not found") from None
            self.message_user(request, f"{obj.url}: {exc.message}", messages.WARNING)
            return
        self.message_user(request, f"{obj.url}: test event queued (delivery {delivery.id})")

    def get_urls(self):
        return [
            path(
                "<path:object_id>/test/",
                self.admin_site.admin_view(self.test_view),
                name="webhooks_webhooksubscription_test",
            )
        ] + super().get_urls()

    def test_view(self, request, object_id):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        obj = self.get_object(request, object_id)
        if obj is None:
            raise Http404("not found")
        if not self.has_change_permission(request, obj):
            raise PermissionDenied
        self._test(request, obj)
        return HttpResponseRedirect(reverse("admin:webhooks_webhooksubscription_change", args=[obj.pk]))


@admin.register(Delivery)
class DeliveryAdmin(TenantScoped):
    list_display = ("id", "kind", "target", "event_type", "run", "status", "attempts", "error", "created_at")
    list_filter = ("status", "kind", "event_type")
    search_fields = ("id", "hook")
    readonly_fields = [f.name for f in Delivery._meta.fields]
    list_select_related = ("subscription",)

    @admin.display(description="hook / subscription")
    def target(self, obj):
        return obj.hook if obj.kind == "hook" else (obj.subscription.url if obj.subscription else "(deleted)")

    @admin.display(description="last error")
    def error(self, obj):
        return (obj.last_error or "")[:120]

    @admin.display(description="hook / subscription")
    def target_masked(self, obj):
        return obj.hook if obj.kind == "hook" else (str(obj.subscription) if obj.subscription else "(deleted)")

    @admin.display(description="last error")
    def error_masked(self, obj):
        return visibility.masked_error(obj.last_error)[:120]

    @admin.display(description="last error")
    def last_error_masked(self, obj):
        return visibility.masked_error(obj.last_error)

    _MASKED = {"target": "target_masked", "error": "error_masked", "last_error": "last_error_masked"}

    def get_list_display(self, request):
        shown = super().get_list_display(request)
        if visibility.sees_secrets(request.user):
            return shown
        return tuple(self._MASKED.get(name, name) for name in shown)

    def get_fields(self, request, obj=None):
        fields = super().get_fields(request, obj)
        if visibility.sees_secrets(request.user):
            return fields
        return list(dict.fromkeys(self._MASKED.get(name, name) for name in fields))

    def get_readonly_fields(self, request, obj=None):
        readonly = tuple(super().get_readonly_fields(request, obj))
        return readonly if visibility.sees_secrets(request.user) else (*readonly, "last_error_masked")

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and (
            request.user.has_perm("webhooks.view_delivery") or services.can_manage(request.user)
        )
