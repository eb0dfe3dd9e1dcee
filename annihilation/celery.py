"""The Celery entry point: `celery -A annihilation worker` (or beat) loads the project's
settings and the application defined in core."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "annihilation.settings")

from core.celery import app

__all__ = ["app"]
