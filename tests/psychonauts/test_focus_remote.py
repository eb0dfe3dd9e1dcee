"""The Focus page of an agent whose repository is central (remote mode): its diff is the branch
as this host last fetched it. The request runs no fetch; opening the page asks a worker to fetch,
once per quantum in a while, and the next draw shows what the worker fetched."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from bursts.models import AgentRun
from core.access import operator_ensure
from psychonauts.focus import focus_branches_fetch, focus_fetch_due, worktree_diff
from psychonauts.tasks import focus_fetch
from psychonauts.workspaces.git import git
from psychonauts.workspaces.registration import repository_inspect
from psychonauts.workspaces.repository import branch_for
from psychonauts.workspaces.worktrees import demo_repo_ensure, workspace_commit, workspace_ensure
from quanta.models import Quantum
from quanta.services import quantum_create
from repos.context import working_on_quantum
from repos.services import repository_create

pytestmark = pytest.mark.django_db


def _push_from_elsewhere(central: Path, branch: str, tmp_path: Path) -> None:
    """Another host's commit on the branch, pushed to the central repository."""
    other = tmp_path / "other-host"
    subprocess.run(["git", "clone", "-q", "-b", branch, str(central), str(other)], check=True)
    (other / "elsewhere.txt").write_text("from another host\n")
    for args in (["add", "-A"], ["-c", "user.name=o", "-c", "user.email=o@x", "commit", "-qm", "o"],
                 ["push", "-q", "origin", branch]):  # fmt: skip
        subprocess.run(["git", *args], cwd=other, check=True)


@pytest.fixture
def remote_quantum(repo: Path, tmp_path: Path) -> tuple[int, Path]:
    central = tmp_path / "central.git"
    subprocess.run(
        ["git", "clone", "-q", "--bare", str(demo_repo_ensure(tmp_path / "src")), str(central)],
        check=True,
    )
    remote = repository_create(
        name="remote", location=f"file://{central}", target_branch="main",
        inspect=repository_inspect,
    )  # fmt: skip
    quantum = quantum_create(title="remote work", repository_id=remote.pk)
    with working_on_quantum(quantum.pk):
        tree = workspace_ensure(quantum_id=quantum.pk)
        (tree / "mine.txt").write_text("pushed by this host\n")
        workspace_commit(workspace=tree, quantum_id=quantum.pk, agent_id="t", role="coder")
    assert git("show", f"{branch_for(quantum.pk)}:mine.txt", cwd=central)
    return quantum.pk, central


def test_the_diff_is_the_last_fetched_state_and_a_fetch_brings_the_rest(
    remote_quantum: tuple[int, Path], tmp_path: Path
) -> None:
    quantum_id, central = remote_quantum
    _push_from_elsewhere(central, branch_for(quantum_id), tmp_path)

    diff = worktree_diff(quantum_id=quantum_id)
    assert "mine.txt" in diff and "elsewhere.txt" not in diff  # nothing fetched by the read

    focus_branches_fetch(quantum_id=quantum_id)
    assert "elsewhere.txt" in worktree_diff(quantum_id=quantum_id)


def test_opening_the_page_sends_one_fetch_to_a_worker_not_the_request(
    remote_quantum: tuple[int, Path],
    tmp_path: Path,
    client: Client,
    redis_client: Any,
    make_run: Callable[..., AgentRun],
) -> None:
    quantum_id, central = remote_quantum
    _push_from_elsewhere(central, branch_for(quantum_id), tmp_path)
    run = make_run(quantum=Quantum.objects.get(pk=quantum_id))
    client.force_login(operator_ensure(username="op", password="pw-operator"))
    redis_client.delete("celery")

    def page() -> str:
        return client.get(reverse("focus", args=[run.pk])).content.decode()

    first = page()
    assert "mine.txt" in first and "elsewhere.txt" not in first
    page()  # a reload within the interval asks for no second fetch
    queued = [json.loads(m)["headers"] for m in redis_client.lrange("celery", 0, -1)]
    assert [(h["task"], h["argsrepr"]) for h in queued] == [
        ("psychonauts.focus_fetch", f"({quantum_id},)")
    ]

    focus_fetch(quantum_id)  # what the worker runs
    assert "elsewhere.txt" in page()


def test_a_local_repository_needs_no_fetch(repo: Path) -> None:
    quantum = quantum_create(title="local work")
    assert not focus_fetch_due(quantum_id=quantum.pk)
