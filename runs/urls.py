from django.urls import path

from . import views

urlpatterns = [
    path("runs/", views.runs_list, name="runs-list"),
    path("runs/<uuid:run_id>/", views.run_detail, name="run-detail"),
    path("runs/<uuid:run_id>/decide/", views.run_decide, name="run-decide"),
    path("runs/<uuid:run_id>/cancel/", views.run_cancel_view, name="run-cancel"),
]
