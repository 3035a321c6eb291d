import json

from django.core.management.base import BaseCommand, CommandError

from runs.errors import RunError
from runs.services import run_get
from runs.services.selectors import run_events, run_to_dict


class Command(BaseCommand):
    help = "Print a run as one JSON object in the REST shape (with --events, its events)."

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--events", action="store_true")
        parser.add_argument("--after", type=int, default=0)

    def handle(self, *args, **opts):
        try:
            run = run_get(tenant=None, run_id=opts["run_id"])
        except RunError as exc:
            raise CommandError(exc.message) from None
        out = run_to_dict(run)
        if opts["events"]:
            events, after = [], opts["after"]
            while True:
                page, nxt = run_events(run=run, after=after, limit=500)
                events += page
                if nxt is None:
                    break
                after = nxt
            out["events"] = events
        self.stdout.write(json.dumps(out, indent=2, default=str))
