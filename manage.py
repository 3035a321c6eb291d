#!/usr/bin/env python
"""Django's command-line utility for agentrt."""

import os
import secrets
import sys
from pathlib import Path


def demo_environment(argv: list[str], var: Path | None = None) -> None:
    """`manage.py demo` on its own starts as `make run` does: with the demo's
    own secret key (var/secret_key, created once, owner-only, as the Makefile
    creates it) and AGENTRT_DEMO=1 — for this command only; every other
    command still refuses to start without DJANGO_SECRET_KEY."""
    if argv[1:2] != ["demo"] or os.environ.get("DJANGO_SECRET_KEY"):
        return
    path = (var or Path(__file__).resolve().parent / "var") / "secret_key"
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(50) + "\n")
        os.replace(tmp, path)
    os.environ["DJANGO_SECRET_KEY"] = path.read_text().strip()
    os.environ.setdefault("AGENTRT_DEMO", "1")


def main():
    demo_environment(sys.argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrt_site.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        if "DJANGO_SECRET_KEY" in str(exc):  # the settings' refusal: the message, not a traceback
            sys.exit(f"agentrt: {exc}")
        raise


if __name__ == "__main__":
    main()
