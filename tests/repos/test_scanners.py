"""The scanners pass over each repository and file what they find in that repository."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autopilot.models import Finding
from autopilot.services.scanners import scan_run, scans_run
from psychonauts.workspaces.registration import repository_inspect
from psychonauts.workspaces.worktrees import demo_repo_ensure
from quanta.models import Quantum
from repos.services import repository_create, repository_default
from tests.autopilot.test_scanners import LONG_AGO, commit, scan_settings

__all__ = ["scan_settings"]

pytestmark = pytest.mark.django_db

SAME: dict[str, str | bytes] = {"app.py": "x = 1  # TODO: handle none\n"}


def test_each_repository_is_scanned_and_gets_its_own_quanta(
    repo: Path, scan_settings: Any, tmp_path: Path
) -> None:
    second_path = demo_repo_ensure(tmp_path / "second")
    commit(second_path, {"calc.py": "def add(a, b):\n    return a + b\n"}, "clean", when=LONG_AGO)
    second = repository_create(name="second", location=str(second_path), inspect=repository_inspect)
    # The same finding in both repositories: one quantum in each.
    commit(repo, SAME, "work", when=LONG_AGO)
    commit(second_path, {**SAME, "only.py": "# FIXME: only in the second\n"}, "w", when=LONG_AGO)

    reports = scans_run()

    assert set(reports) == {"default", "second"}
    assert all(r.errors == [] for r in reports.values()), {n: r.errors for n, r in reports.items()}
    mine = Quantum.objects.filter(pk__in=reports["default"].quanta)
    theirs = Quantum.objects.filter(pk__in=reports["second"].quanta)
    assert set(mine.values_list("repository_id", flat=True)) == {repository_default().pk}
    assert set(theirs.values_list("repository_id", flat=True)) == {second.pk}
    assert sorted(q.title for q in mine) == ["Resolve 1 TODO/FIXME comment in app.py"]
    assert sorted(q.title for q in theirs) == [
        "Resolve 1 TODO/FIXME comment in app.py",
        "Resolve 1 TODO/FIXME comment in only.py",
    ]
    assert Finding.objects.filter(path="app.py").count() == 2  # remembered per repository
    # Scanned again: nothing new in either.
    assert scan_run(repository_id=second.pk).quanta == [] and scan_run().quanta == []
