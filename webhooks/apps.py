from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Post-run hooks: AGENTRT_HOOK_MODULES and every installed app's
        # `agent_hooks` module. A module that fails to import stops the process
        # (ImproperlyConfigured naming the module and its error).
        from runs.hooks import load_hook_modules

        load_hook_modules()
