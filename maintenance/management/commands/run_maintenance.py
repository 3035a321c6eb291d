import json
import signal

from django.core.management.base import BaseCommand

from maintenance.runner import run_forever, run_once


class Command(BaseCommand):
    help = "Run the maintenance sweeps (reclaim expired leases, prune checkpoints) — safe on every node."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="run each sweep once and exit")

    def handle(self, *args, **opts):
        if opts["once"]:
            self.stdout.write(json.dumps(run_once(), default=str))
            return
        stopping = {"flag": False}

        def stop(signum, frame):
            stopping["flag"] = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        run_forever(stop=lambda: stopping["flag"])
