from django.apps import AppConfig


class CheckpointsConfig(AppConfig):
    name = "checkpoints"
    default_auto_field = "django.db.models.BigAutoField"
