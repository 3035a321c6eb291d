#!/usr/bin/env python
"""Django's command-line utility for agentrt."""

import os
import sys


def main():
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
