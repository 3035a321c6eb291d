from django.core.management.base import BaseCommand, CommandError

from runs.errors import RunError
from runs.services import tenant_create


class Command(BaseCommand):
    help = "Create a tenant (if needed) and make USER its member."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--user", required=True)
        parser.add_argument("--password", default=None)

    def handle(self, *args, **opts):
        try:
            tenant, user = tenant_create(name=opts["name"], username=opts["user"], password=opts["password"])
        except RunError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(f"tenant {tenant.name} ({tenant.id}); member {user.username}")
