"""The Celery application of the tests' workers: the project's (`annihilation`), with the
test executor (tests/bursts/executors.py) behind the bursts seam when the worker's environment
says BURSTS_TEST_EXECUTOR=scripted. The apps load here, first: the test executor replaces the
agent runtime that psychonauts registers as they load."""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "annihilation.settings")
django.setup()

from annihilation.celery import app  # noqa: E402
from bursts.executor import EXECUTOR  # noqa: E402
from tests.bursts.executors import scripted  # noqa: E402

if os.environ.get("BURSTS_TEST_EXECUTOR") == "scripted":
    EXECUTOR.register(scripted)

__all__ = ["app"]
