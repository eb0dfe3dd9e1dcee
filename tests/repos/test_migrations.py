"""The migrations give every existing quantum, wave, goal and base check the default repository
(ANNIHILATION_REPO), losing none."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from autopilot.models import BaseCheck, Goal
from bursts.models import Wave
from quanta.models import Quantum
from repos.models import Repository

BEFORE = [
    ("quanta", "0007_quantum_list_order"),
    ("bursts", "0004_fewer_indexes"),
    ("autopilot", "0002_spend_goal_index_once"),
    ("repos", None),
]


def _migrate(targets: list[tuple[str, str | None]]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def _latest() -> list[tuple[str, str | None]]:
    """Every app's latest migration: going back unapplies the apps that depend on these too
    (the forges), and the tests after this one need the whole schema."""
    executor = MigrationExecutor(connection)
    return list(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_existing_rows_move_to_the_default_repository(settings, tmp_path: Path) -> None:
    settings.ANNIHILATION_REPO = tmp_path / "repo"
    latest = _latest()
    _migrate(BEFORE)
    try:
        with connection.cursor() as cursor:
            for n in range(3):
                cursor.execute(
                    "INSERT INTO quanta_quantum (title, body, kind, status, priority, labels,"
                    " pipeline, acceptance, verify_commands, complexity, complexity_auto,"
                    " close_reason, created_at, updated_at, open_blockers)"
                    " VALUES (%s, '', 'task', 'open', 2, '{}', '', '', '{}', 'standard', false,"
                    " '', now(), now(), 0)",
                    [f"old quantum {n}"],
                )
            cursor.execute(
                "INSERT INTO bursts_wave (status, labels, continuous, max_bursts, burst_count,"
                " started_by, error, stats, started_at) VALUES"
                " ('done', '{}', false, 1, 0, 'old', '', '{}', now())"
            )
            cursor.execute(
                "INSERT INTO autopilot_goal (title, description, success_criteria,"
                " verify_commands, priority, labels, source, status, reason, plan_tries,"
                " created_by, approved_by, created_at, updated_at) VALUES ('old goal', '', 'x',"
                " '{}', 2, '{}', 'operator', 'proposed', '', 0, '', '', now(), now())"
            )
            for ok in (False, True):
                cursor.execute(
                    "INSERT INTO autopilot_basecheck (sha, ok, summary, created_at)"
                    " VALUES ('abc123', %s, 'old check', now())",
                    [ok],
                )
    finally:
        _migrate(latest)

    default = Repository.objects.get(is_default=True)
    assert (default.name, default.location) == ("default", str(tmp_path / "repo"))
    old = Quantum.objects.filter(title__startswith="old quantum")
    assert old.count() == 3
    assert set(old.values_list("repository_id", flat=True)) == {default.pk}
    assert Wave.objects.get(started_by="old").repository_id == default.pk
    assert Goal.objects.get(title="old goal").repository_id == default.pk
    checks = BaseCheck.objects.filter(summary="old check")
    assert sorted(checks.values_list("ok", flat=True)) == [False, True]
    assert set(checks.values_list("repository_id", flat=True)) == {default.pk}
