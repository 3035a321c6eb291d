"""Decisions made from the command line (`manage.py approvals approve|reject|confirm`) say so: `decided_via` "cli"."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0003_redundant_key_indexes"),
    ]

    operations = [
        migrations.AlterField(
            model_name="approval",
            name="decided_via",
            field=models.CharField(
                blank=True,
                choices=[("admin", "admin"), ("api", "api"), ("live", "live"), ("cli", "cli")],
                max_length=8,
                null=True,
            ),
        ),
    ]
