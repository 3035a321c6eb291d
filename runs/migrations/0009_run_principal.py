from django.db import migrations, models


class Migration(migrations.Migration):
    """The submitting principal and its scope set, stamped on the run at submission."""

    dependencies = [
        ("runs", "0008_leaner_event_and_invocation_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="principal_user_id",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="run",
            name="principal_scopes",
            field=models.JSONField(blank=True, default=list),
        ),
    ]
