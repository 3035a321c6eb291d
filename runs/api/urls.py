"""Routes of the REST API, mounted under /api/."""

from django.urls import path, re_path

from runs.api import lineage, views
from runs.api.errors import api_not_found
from webhooks import api as webhooks

app_name = "api"

urlpatterns = [
    path("agents/", views.AgentListCreate.as_view(), name="agent-list"),
    path("runs/", views.RunListCreate.as_view(), name="run-list"),
    path("runs/<str:id>/", views.RunDetail.as_view(), name="run-detail"),
    path("runs/<str:id>/events/", views.RunEvents.as_view(), name="run-events"),
    path("runs/<str:id>/cancel/", views.RunCancel.as_view(), name="run-cancel"),
    path("runs/<str:id>/resume/", views.RunResume.as_view(), name="run-resume"),
    path("runs/<str:id>/retry/", views.RunRetry.as_view(), name="run-retry"),
    path("runs/<str:id>/input/", views.RunInput.as_view(), name="run-input"),
    path("runs/<str:id>/fork/", lineage.RunFork.as_view(), name="run-fork"),
    path("runs/<str:id>/replay/", lineage.RunReplay.as_view(), name="run-replay"),
    path("runs/<str:id>/compare/<str:other>/", lineage.RunCompare.as_view(), name="run-compare"),
    path("runs/<str:id>/compare/<str:other>", lineage.RunCompareBare.as_view(), name="run-compare-bare"),
    path("approvals/", views.ApprovalList.as_view(), name="approval-list"),
    path("approvals/<str:id>/", views.ApprovalDetail.as_view(), name="approval-detail"),
    path("approvals/<str:id>/approve/", views.ApprovalApprove.as_view(), name="approval-approve"),
    path("approvals/<str:id>/reject/", views.ApprovalReject.as_view(), name="approval-reject"),
    path("approvals/<str:id>/confirm/", views.ApprovalConfirm.as_view(), name="approval-confirm"),
    path("webhooks/", webhooks.WebhookListCreate.as_view(), name="webhook-list"),
    path("webhooks/<str:id>/", webhooks.WebhookDetail.as_view(), name="webhook-detail"),
    path("webhooks/<str:id>/test/", webhooks.WebhookTest.as_view(), name="webhook-test"),
    path("webhooks/<str:id>/deliveries/", webhooks.WebhookDeliveries.as_view(), name="webhook-deliveries"),
    path("schema/", views.SchemaView.as_view(), name="schema"),
    path("docs/", views.SwaggerView.as_view(url_name="api:schema"), name="docs"),
    path("docs/redoc/", views.RedocView.as_view(url_name="api:schema"), name="redoc"),
    # Anything else under /api/ answers with the API's error body, not Django's HTML 404.
    re_path(r"^(?P<rest>.*)$", api_not_found, name="not-found"),
]
