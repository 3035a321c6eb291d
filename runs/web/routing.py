from django.urls import path

from runs.web.consumers import RunEventsConsumer, RunsConsumer

websocket_urlpatterns = [
    path("ws/runs/<uuid:run_id>/", RunEventsConsumer.as_asgi()),
    path("ws/runs/", RunsConsumer.as_asgi()),
]
