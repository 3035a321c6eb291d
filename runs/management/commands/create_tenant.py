from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from runs.errors import RunError
from runs.services import tenant_create

# The service's field of each list option (an error in a list names the option the operator typed).
LIST_OPTIONS = {"tools": "allowed_tools", "endpoints": "allowed_endpoints"}


def names(text: str) -> list[str] | None:
    """`a,b` -> ["a", "b"]; `all` -> None (every one); "" -> [] (none)."""
    if text.strip().lower() == "all":
        return None
    return [name.strip() for name in text.split(",") if name.strip()]


class Command(BaseCommand):
    help = (
        "Create a tenant (if needed) and make USER its member (with --operator: an operator with admin access); "
        "--tools / --endpoints set the tools and model endpoints its agents may use."
    )

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--user", default=None, help="make USER a member (created if missing)")
        parser.add_argument("--password", default=None)
        parser.add_argument(
            "--operator",
            action="store_true",
            help="staff with the operator permissions: resolve approvals, cancel and resume runs, view runs",
        )
        parser.add_argument(
            "--tools",
            default=None,
            metavar="A,B",
            help="the only tools the tenant's agents may use (comma-separated registered names; '' for none, "
            "'all' for every one, the default of a new tenant); also on an existing tenant",
        )
        parser.add_argument(
            "--endpoints",
            default=None,
            metavar="X,Y",
            help="the only model endpoints (AGENTRT_MODEL_ENDPOINTS names, or a built-in one) the tenant's agents "
            "may use ('' for none, 'all' for every one, the default)",
        )

    def handle(self, *args, **opts):
        lists: dict[str, Any] = {
            field: names(opts[option]) for option, field in LIST_OPTIONS.items() if opts[option] is not None
        }
        if opts["user"] is None and (opts["password"] or opts["operator"]):
            raise CommandError("--password and --operator need --user")
        if opts["user"] is None and not lists:
            raise CommandError("give --user (a member), or --tools / --endpoints (the tenant's allow-lists)")
        if opts["password"]:
            try:  # AUTH_PASSWORD_VALIDATORS (only the demo command sets a weak one, on purpose)
                validate_password(opts["password"], get_user_model()(username=opts["user"]))
            except ValidationError as exc:
                raise CommandError("--password: " + " ".join(exc.messages)) from None
        try:
            tenant, user = tenant_create(
                name=opts["name"],
                username=opts["user"],
                password=opts["password"],
                operator=opts["operator"],
                **lists,
            )
        except RunError as exc:
            for option, field in LIST_OPTIONS.items():
                if field in exc.fields:
                    raise CommandError(f"--{option}: {exc.fields[field][0]}") from None
            raise CommandError(exc.message) from None
        line = f"tenant {tenant.name} ({tenant.id})"
        if user is not None:
            line += f"; {'operator' if opts['operator'] else 'member'} {user.username}"
        for option, field in LIST_OPTIONS.items():
            if field in lists:
                allowed = getattr(tenant, field)
                line += f"; {option}: {', '.join(allowed) or 'none'}" if allowed is not None else f"; {option}: all"
        self.stdout.write(line)
