from django.core.management.base import BaseCommand, CommandError

from runs.clock import CLOCK
from runs.errors import RunError
from runs.models import Run
from runs.services import run_submit, tenant_get

DONE = {"COMPLETED", "FAILED", "CANCELLED", "WAITING_FOR_APPROVAL", "WAITING_FOR_USER"}


class Command(BaseCommand):
    help = "Submit a run; prints its id (and, with --wait, its status once terminal or waiting)."

    def add_arguments(self, parser):
        parser.add_argument("--agent", required=True)
        parser.add_argument("--input", required=True)
        parser.add_argument("--tenant", default="demo")
        parser.add_argument("--session", default=None)
        parser.add_argument("--wait", action="store_true")
        parser.add_argument("--timeout", type=float, default=600)

    def handle(self, *args, **opts):
        try:
            run, _ = run_submit(
                tenant=tenant_get(name=opts["tenant"]),
                agent=opts["agent"],
                input=opts["input"],
                session=opts["session"],
            )
        except RunError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(str(run.id))
        if not opts["wait"]:
            return
        start = CLOCK.monotonic()
        while CLOCK.monotonic() - start < opts["timeout"]:
            status = Run.objects.filter(id=run.id).values_list("status", flat=True).get()
            if status in DONE:
                self.stdout.write(status)
                return
            CLOCK.sleep(0.1)
        raise CommandError(f"run {run.id} still {status} after {opts['timeout']} s")
