from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # imported here, not at the top: the wiring imports models, which need the app registry ready
        from runs.runtime import wiring

        wiring.connect_cluster()
