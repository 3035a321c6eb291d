"""Move API tokens from DRF's authtoken (plaintext keys) to django-rest-knox
(SHA-512 digests, expiring): each existing key becomes a knox token with the
same value, expiring AGENTRT_TOKEN_TTL_DAYS from now, so clients keep working;
then the plaintext table and its migration records are dropped
(`rest_framework.authtoken` is no longer installed)."""
from django.conf import settings
from django.db import migrations


def authtoken_to_knox(apps, schema_editor):
    connection = schema_editor.connection
    if "authtoken_token" not in connection.introspection.table_names():
        return
    from django.utils import timezone
    from knox.crypto import hash_token
    from knox.settings import CONSTANTS, knox_settings

    AuthToken = apps.get_model("knox", "AuthToken")
    with connection.cursor() as cursor:
        cursor.execute("SELECT key, user_id FROM authtoken_token")
        rows = cursor.fetchall()
    ttl = knox_settings.TOKEN_TTL
    for key, user_id in rows:
        AuthToken(
            user_id=user_id, token_key=key[: CONSTANTS.TOKEN_KEY_LENGTH], digest=hash_token(key),
            expiry=timezone.now() + ttl if ttl else None,
        ).save(force_insert=True)
    schema_editor.execute("DROP TABLE authtoken_token")
    schema_editor.execute("DELETE FROM django_migrations WHERE app = 'authtoken'")


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0003_hot_path_no_fk_checks"),
        ("knox", "0009_extend_authtoken_field"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [migrations.RunPython(authtoken_to_knox, migrations.RunPython.noop)]
