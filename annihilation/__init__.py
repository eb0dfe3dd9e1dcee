"""The project package. Its Celery application (`annihilation.celery`, `celery -A annihilation`)
is loaded on first use, not with the package: a command that sends no task does not pay for
it. Every module that defines tasks imports `core.celery`, so that its `shared_task`s are bound
to this application whichever process imports them (tests/core/test_broker.py)."""

from __future__ import annotations

from typing import Any

__all__ = ["celery_app"]


def __getattr__(name: str) -> Any:
    if name == "celery_app":
        from core.celery import app

        return app
    raise AttributeError(f"module 'annihilation' has no attribute {name!r}")
