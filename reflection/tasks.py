"""Celery tasks of reflection: thin adapters over its services."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="reflection.decay", ignore_result=True)
def decay() -> int:
    """The beat's sweep: decay every live rule's confidence to now (idempotent: a second run
    decays only the time since the first)."""
    from reflection.services.playbook import rules_decay

    return rules_decay()
