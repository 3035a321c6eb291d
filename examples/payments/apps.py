from django.apps import AppConfig


class PaymentsConfig(AppConfig):
    name = __name__.rpartition(".")[0]  # "examples.payments", or wherever a copy of the app lives
    label = "payments"
    default_auto_field = "django.db.models.BigAutoField"
