#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "annihilation.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        # A setting from the environment is wrong (settings.py says which and why): one line.
        sys.stderr.write(f"manage.py: configuration error: {exc}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
