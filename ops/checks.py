from django.conf import settings
from django.core.checks import Tags, Warning, register


@register(Tags.security, deploy=True)
def metrics_token_check(app_configs, **kwargs):
    """`manage.py check --deploy`: say that /metrics is open."""
    if settings.AGENTRT_METRICS_TOKEN:
        return []
    return [
        Warning(
            "AGENTRT_METRICS_TOKEN is not set: GET /metrics answers anyone who can reach a web node",
            hint="set it (scrapers send Authorization: Bearer <token>) or block /metrics at the proxy",
            id="agentrt.W001",
        )
    ]
