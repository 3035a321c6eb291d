import json

from django.core.management.base import BaseCommand, CommandError

from runs.errors import RunError
from runs.services import agent_load, tenant_get


class Command(BaseCommand):
    help = "Create or update an agent from a JSON file; prints the new version id last."

    def add_arguments(self, parser):
        parser.add_argument("file")
        parser.add_argument("--tenant", default="demo")

    def handle(self, *args, **opts):
        try:
            with open(opts["file"], encoding="utf-8") as fh:
                definition = json.load(fh)
        except (OSError, ValueError) as exc:
            raise CommandError(f"cannot read {opts['file']}: {exc}") from None
        try:
            version = agent_load(tenant=tenant_get(name=opts["tenant"]), definition=definition)
        except RunError as exc:
            detail = "; ".join(f"{k}: {', '.join(v)}" for k, v in exc.fields.items())
            raise CommandError(
                f"{exc.message}" + (f" ({detail})" if detail and detail not in exc.message else "")
            ) from None
        self.stdout.write(f"agent {version.agent.name}")
        self.stdout.write(version.version)
