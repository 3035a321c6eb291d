from django.core.management.base import BaseCommand, CommandError

from runs.clock import CLOCK
from runs.errors import RunError
from runs.models import Run
from runs.services import run_submit, tenant_get

DONE = {"COMPLETED", "FAILED", "CANCELLED", "WAITING_FOR_APPROVAL", "WAITING_FOR_USER"}


class Command(BaseCommand):
    help = (
        "Submit a run of an agent as the system (no user: a shell command); prints the run's id, and with "
        "--wait its status once it has ended or waits for a person. Exits 1 with the reason when refused "
        "(unknown agent or tenant, a session with another active run, the tenant's quota)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--agent", required=True, metavar="NAME", help="the agent's name (as loaded by load_agent)")
        parser.add_argument("--input", required=True, metavar="TEXT", help="the user's message the run starts from")
        parser.add_argument(
            "--tenant", default="demo", metavar="NAME", help="the tenant the run belongs to (default: demo)"
        )
        parser.add_argument(
            "--session",
            default=None,
            metavar="SESSION_ID",
            help="continue this session (its earlier runs are the run's history); default: a new session",
        )
        parser.add_argument(
            "--wait",
            action="store_true",
            help="return once the run has ended (COMPLETED, FAILED, CANCELLED) or waits for a person "
            "(WAITING_FOR_APPROVAL, WAITING_FOR_USER), and print that status on a second line",
        )
        parser.add_argument(
            "--timeout",
            type=float,
            default=600,
            metavar="SECONDS",
            help="with --wait: give up after this many seconds (exit 1; the run goes on) (default: 600)",
        )

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
