from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from runs import extensions
        from runs.runtime import drain

        drain.connect()
        extensions.load()  # the project's tools and providers; a module that fails stops the process
