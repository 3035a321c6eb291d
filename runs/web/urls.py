from django.contrib.auth import views as auth_views
from django.urls import path

from runs.web import console, lineage, views

urlpatterns = [
    # Members are not staff, so the live pages have their own login (the admin's admits staff only).
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(template_name="runs/login.html", redirect_authenticated_user=True),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(next_page="/accounts/login/"), name="logout"),
    path("runs/", console.runs_list, name="runs-list"),
    path("runs/rows/", console.runs_rows, name="runs-rows"),
    path("runs/<uuid:run_id>/", views.run_detail, name="run-detail"),
    path("runs/<uuid:run_id>/summary/", views.run_summary_view, name="run-summary"),
    path("runs/<uuid:run_id>/decide/", views.run_decide, name="run-decide"),
    path("runs/<uuid:run_id>/cancel/", views.run_cancel_view, name="run-cancel"),
    path("runs/<uuid:run_id>/retry/", views.run_retry_view, name="run-retry"),
    path("runs/<uuid:run_id>/fork/", lineage.run_fork_view, name="run-fork"),
    path("runs/<uuid:run_id>/replay/", lineage.run_replay_view, name="run-replay"),
    path("runs/<uuid:run_id>/compare/<uuid:other_id>/", lineage.run_compare_page, name="run-compare"),
    path("approvals/", console.approvals_inbox, name="approvals-inbox"),
    path("approvals/rows/", console.approvals_rows, name="approvals-rows"),
    path("approvals/count/", console.approvals_count, name="approvals-count"),
]
