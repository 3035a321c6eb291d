"""`make run`: migrate, create the demo tenant, operator and agents, start
web + worker + maintenance, submit demo runs, print where to look.
Ctrl-C stops everything."""
import os
import signal
import subprocess
import sys
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import BaseCommand

from runs.clock import CLOCK
from runs.services import agent_load, run_submit, tenant_create

DEMO = Path(settings.BASE_DIR) / "demo"


class Command(BaseCommand):
    help = "Start agentrt with a demo tenant, operator and agents (what `make run` does)."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8000)))
        parser.add_argument("--no-serve", action="store_true", help="set up and submit, but start no processes")

    def handle(self, *args, **opts):
        port = opts["port"]
        call_command("migrate", verbosity=0)
        # The demo's well-known operator/operator exists only here: tenant_create
        # sets the password without the validators (AUTH_PASSWORD_VALIDATORS
        # refuse it), on purpose and nowhere else — create_tenant validates.
        tenant, operator = tenant_create(name="demo", username="operator", password="operator", operator=True)
        # The demo operator also publishes agents over REST and edits the tenant's policy floor.
        operator.user_permissions.add(*Permission.objects.filter(codename__in=["publish_agent", "change_tenant", "view_tenant"]))
        for path in sorted(DEMO.glob("*.json")):
            import json

            definition = json.loads(path.read_text())
            for turn in definition["model"].get("turns", []):
                for call in turn.get("tool_calls", []):
                    url = call.get("arguments", {}).get("url")
                    if isinstance(url, str):
                        call["arguments"]["url"] = url.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
            agent_load(tenant=tenant, definition=definition)
        env = dict(os.environ)
        env["AGENTRT_DEMO"] = "1"  # the web process mounts /demo/hook only under the demo
        env.setdefault("AGENTRT_HTTP_TOOL_ALLOWED_HOSTS", f"127.0.0.1:{port}")
        env.setdefault("AGENTRT_LOG_LEVEL", "INFO")
        procs = []
        if not opts["no_serve"]:
            manage = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py")]
            procs = [
                subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "agentrt_site.asgi:application"], env=env),
                subprocess.Popen(manage + ["qcluster"], env=env),
                subprocess.Popen(manage + ["run_maintenance"], env=env),
            ]
        reader, _ = run_submit(tenant=tenant, agent="reader", input="Check that the service is healthy.")
        release, _ = run_submit(tenant=tenant, agent="release-bot", input="Ship release 1.4.2.")
        base = f"http://127.0.0.1:{port}"
        self.stdout.write(self.style.SUCCESS("\nagentrt is running on the embedded default (SQLite)."))
        self.stdout.write(f"  live runs: {base}/runs/            login operator / operator")
        self.stdout.write(f"  waiting:   {base}/runs/{release.id}/   (release-bot asks approval for its http_post)")
        self.stdout.write(f"  approvals: {base}/admin/approvals/approval/")
        self.stdout.write(f"  API:       {base}/api/docs/")
        self.stdout.write(f"  demo runs: reader {reader.id}\n             release-bot {release.id}")
        self.stdout.write(f"  CLI:       .venv/bin/python manage.py show_run {release.id} --events")
        self.stdout.write("Ctrl-C stops web, worker and maintenance.\n")
        if not procs:
            return
        try:
            while all(p.poll() is None for p in procs):
                CLOCK.sleep(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
