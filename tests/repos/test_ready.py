"""The ready query and the scanners see one repository's quanta."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection

from psychonauts.workspaces.registration import repository_inspect
from psychonauts.workspaces.worktrees import demo_repo_ensure
from quanta.models import Quantum
from quanta.selectors import quanta_ready
from quanta.services import quantum_create
from repos.services import repository_create, repository_default

pytestmark = pytest.mark.django_db


def test_the_ready_query_filters_by_repository_through_its_index(
    repo: Path, tmp_path: Path
) -> None:
    second = repository_create(
        name="second",
        location=str(demo_repo_ensure(tmp_path / "second")),
        inspect=repository_inspect,
    )
    default = repository_default()
    mine = [quantum_create(title=f"default {n}").pk for n in range(3)]
    theirs = [quantum_create(title=f"second {n}", repository_id=second.pk).pk for n in range(2)]

    assert list(quanta_ready(repository_id=default.pk).values_list("pk", flat=True)) == mine
    assert list(quanta_ready(repository_id=second.pk).values_list("pk", flat=True)) == theirs
    assert set(quanta_ready().values_list("pk", flat=True)) == {*mine, *theirs}

    # The partial index that serves one repository's ready page in order on a big table (the
    # planner's choice on this test's tiny table is no evidence either way; bench/ready_query.py
    # times the walk at 100,000 quanta).
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'quantum_ready_repository'"
        )
        (definition,) = cursor.fetchone()
    assert "(repository_id, priority, created_at, id)" in definition, definition
    assert "status" in definition and "open_blockers = 0" in definition, definition
    assert Quantum.objects.filter(repository=second).count() == 2
