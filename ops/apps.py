from django.apps import AppConfig


class OpsConfig(AppConfig):
    """Operations: deployment-wide metrics, per-process worker metrics,
    structured logs, health and readiness, the fleet at a glance."""

    name = "ops"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from ops import checks, tracing, worker_metrics  # noqa: F401 - checks registers `check --deploy`'s metrics warning

        tracing.configure()

        worker_metrics.start_if_worker_node()
