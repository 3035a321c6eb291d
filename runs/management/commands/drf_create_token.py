"""`manage.py drf_create_token USER`: the command DRF's authtoken app used to
provide, now creating a django-rest-knox token (stored as a digest, expiring
after AGENTRT_TOKEN_TTL_DAYS). The plaintext is printed once and never kept.
Revoke a token by deleting it in the admin (Knox › Auth tokens) or with --reset."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Create an API token for USER (Authorization: Token <token>); prints it once."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("-r", "--reset", action="store_true", help="revoke the user's existing tokens first")

    def handle(self, *args, **opts):
        from knox.models import AuthToken
        from knox.settings import knox_settings

        username = opts["username"]
        user = get_user_model()._default_manager.filter(**{get_user_model().USERNAME_FIELD: username}).first()
        if user is None:
            raise CommandError(f"Cannot create the Token: user {username} does not exist")
        if opts["reset"]:
            AuthToken.objects.filter(user=user).delete()
        _, token = AuthToken.objects.create(user=user, expiry=knox_settings.TOKEN_TTL)
        self.stdout.write(f"Generated token {token} for user {username}")
