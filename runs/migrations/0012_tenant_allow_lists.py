"""Per-tenant allow-lists of tools and model endpoints:
`Tenant.allowed_tools` and `Tenant.allowed_endpoints`, JSON lists of names;
null (every existing tenant) keeps today's behaviour: every tool and every
endpoint."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0011_redundant_key_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="tenant",
            name="allowed_tools",
            field=models.JSONField(blank=True, default=None, null=True),
        ),
        migrations.AddField(
            model_name="tenant",
            name="allowed_endpoints",
            field=models.JSONField(blank=True, default=None, null=True),
        ),
    ]
