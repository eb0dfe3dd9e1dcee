"""The merge queue checks a change with the repository's real tests, in the repository's
environment of the merged result (a package only its virtualenv has)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from psychonauts.environments.models import EnvironmentBuild
from tests.psychonauts.test_environments import python_project
from tests.tether.test_merge_queue import review_of
from tether.models import ChangeReview, ChangeStatus
from tether.services import changes_approve
from tether.services.merge_queue import merge_queue_run

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing")

TESTS = ["python test_greet.py"]


def test_the_merge_queue_runs_the_real_tests_in_the_environment(
    db: None, repo: Path, make_quantum: Any, tether_settings: Any, tmp_path: Path
) -> None:
    tether_settings.ENV_ROOT = tmp_path / "home" / "environments"
    tether_settings.ENV_DECLARATION = ""
    python_project(repo)
    good = review_of(
        make_quantum("a second test", verify_commands=TESTS),
        {"test_more.py": "import greetlib\nassert greetlib.greet('y') == 'hi y'\n"},
    )
    bad = review_of(
        make_quantum("breaks the test", verify_commands=TESTS),
        {"test_greet.py": "import greetlib\nassert greetlib.greet('x') == 'bye x'\n"},
    )
    changes_approve(change_ids=[good.pk, bad.pk])

    report = merge_queue_run()

    assert report.merged == [good.pk]
    merged = ChangeReview.objects.get(pk=good.pk)
    assert [c["passed"] for c in merged.checks] == [True]
    assert "tests passed" in merged.checks[0]["output"]
    failed = ChangeReview.objects.get(pk=bad.pk)
    assert failed.status == ChangeStatus.FAILED
    # It ran (greetlib imported from the environment) and failed on its own assertion.
    assert "AssertionError" in failed.checks[0]["output"]
    assert "No module named" not in failed.checks[0]["output"]
    assert EnvironmentBuild.objects.count() == 1
