from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # imported here, not at the top: both import models, which need the app registry ready
        from runs import extensions
        from runs.runtime import wiring

        wiring.connect_cluster()
        wiring.connect_intents()  # before anything commits: the store runs what joins a commit through them
        extensions.load()  # the project's tools and providers; a module that fails stops the process
