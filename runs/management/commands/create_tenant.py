from django.core.management.base import BaseCommand, CommandError

from runs.errors import RunError
from runs.services import tenant_create


class Command(BaseCommand):
    help = "Create a tenant (if needed) and make USER its member (with --operator: an operator with admin access)."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--user", required=True)
        parser.add_argument("--password", default=None)
        parser.add_argument(
            "--operator",
            action="store_true",
            help="staff with the operator permissions: resolve approvals, cancel and resume runs, view runs",
        )

    def handle(self, *args, **opts):
        if opts["password"]:
            from django.contrib.auth import get_user_model
            from django.contrib.auth.password_validation import validate_password
            from django.core.exceptions import ValidationError

            try:  # AUTH_PASSWORD_VALIDATORS (only the demo command sets a weak one, on purpose)
                validate_password(opts["password"], get_user_model()(username=opts["user"]))
            except ValidationError as exc:
                raise CommandError("--password: " + " ".join(exc.messages)) from None
        try:
            tenant, user = tenant_create(
                name=opts["name"], username=opts["user"], password=opts["password"], operator=opts["operator"]
            )
        except RunError as exc:
            raise CommandError(exc.message) from None
        role = "operator" if opts["operator"] else "member"
        self.stdout.write(f"tenant {tenant.name} ({tenant.id}); {role} {user.username}")
