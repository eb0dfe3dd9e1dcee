"""A failed environment build is shown where the operator looks: on its repository's row of the
Repositories page and on the dashboard, with the redacted log one link away."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from psychonauts.environments.models import BuildStatus, EnvironmentBuild
from psychonauts.environments.selectors import environments_failed
from psychonauts.workspaces.registration import repository_inspect
from psychonauts.workspaces.worktrees import demo_repo_ensure
from repos.services import repository_create, repository_default

pytestmark = pytest.mark.django_db


def build(repo: Path, key: str, status: str, *, error: str = "", log: str = "") -> EnvironmentBuild:
    return EnvironmentBuild.objects.create(
        host="h1", key=key, repository=str(repo), status=status, error=error, log=log,
        started_at=timezone.now(), finished_at=timezone.now(),
    )  # fmt: skip


def test_a_failed_build_is_an_error_on_its_repository_and_the_dashboard(
    viewer_client, repo: Path, tmp_path: Path
) -> None:
    repository_default()
    other = demo_repo_ensure(tmp_path / "second")
    repository_create(name="second", location=str(other), inspect=repository_inspect)
    failed = build(
        repo, "a" * 64, BuildStatus.FAILED,
        error="setup command 2 exited with exit status 3",
        log="$ pip install -r requirements.txt\nERROR: no matching distribution [REDACTED]\n",
    )  # fmt: skip
    build(other, "b" * 64, BuildStatus.READY)

    page = viewer_client.get("/repositories/").content.decode()
    row = page.split('data-name="default"')[1].split("</tr>")[0]
    assert "Environment build failed" in row and "exit status 3" in row
    assert "no matching distribution" in row  # the log's tail
    assert f"/repositories/environments/{failed.pk}/log/" in row
    second = page.split('data-name="second"')[1].split("</tr>")[0]
    assert "Environment build failed" not in second

    dashboard = viewer_client.get("/").content.decode()
    assert 'id="environment-failures"' in dashboard
    assert "Repository default: its environment failed to build" in dashboard
    assert "exit status 3" in dashboard and "Repository second" not in dashboard

    log = viewer_client.get(f"/repositories/environments/{failed.pk}/log/")
    assert log.status_code == 200 and log["Content-Type"].startswith("text/plain")
    assert "no matching distribution [REDACTED]" in log.content.decode()
    assert viewer_client.get("/repositories/environments/999999/log/").status_code == 404


def test_a_failure_followed_by_a_ready_build_is_no_longer_shown(viewer_client, repo: Path) -> None:
    repository_default()
    old = build(repo, "c" * 64, BuildStatus.FAILED, error="boom")
    EnvironmentBuild.objects.filter(pk=old.pk).update(
        started_at=timezone.now() - timedelta(hours=1)
    )
    assert [f.build_id for f in environments_failed()] == [old.pk]
    build(repo, "d" * 64, BuildStatus.READY)
    assert environments_failed() == []
    assert 'id="environment-failures"' not in viewer_client.get("/").content.decode()


def test_the_quantum_page_says_its_agents_do_not_run_for_their_environment(
    viewer_client, repo: Path, tmp_path: Path
) -> None:
    from bursts.models import AgentRun, AgentStatus
    from psychonauts.environments.models import EnvironmentWaiter
    from psychonauts.roles import roles_sync_defaults
    from psychonauts.runtime.runs import agent_run_create
    from quanta.services import quantum_create

    roles_sync_defaults()
    repository_default()
    other = demo_repo_ensure(tmp_path / "second")
    second = repository_create(name="second", location=str(other), inspect=repository_inspect)
    here = quantum_create(title="in the default repository")
    there = quantum_create(title="in the second", repository_id=second.pk)
    assert (
        'id="quantum-environment"' not in viewer_client.get(f"/quanta/{here.pk}/").content.decode()
    )

    failed = build(repo, "e" * 64, BuildStatus.FAILED, error="setup command 1 exited with exit status 2",
                   log="$ npm ci\nnpm ERR! missing lockfile\n")  # fmt: skip
    page = viewer_client.get(f"/quanta/{here.pk}/").content.decode()
    state = page.split('id="quantum-environment"')[1].split("</div>")[0]
    assert "Not running: its repository's environment failed to build" in state
    assert "exit status 2" in state and "npm ERR! missing lockfile" in state
    assert f"repos env build {failed.pk}" in state
    assert f"/repositories/environments/{failed.pk}/log/" in state
    # The other repository's quantum is not held by it.
    assert (
        'id="quantum-environment"' not in viewer_client.get(f"/quanta/{there.pk}/").content.decode()
    )

    # An agent of the second's quantum waits on a build in progress: the page says so.
    building = build(other, "f" * 64, BuildStatus.BUILDING)
    run = agent_run_create(quantum_id=there.pk, role="coder")
    AgentRun.objects.filter(pk=run.pk).update(status=AgentStatus.WAITING)
    EnvironmentWaiter.objects.create(build=building, agent_run_id=run.pk)
    page = viewer_client.get(f"/quanta/{there.pk}/").content.decode()
    state = page.split('id="quantum-environment"')[1].split("</div>")[0]
    assert "Waiting: its repository's environment is being built" in state
    assert run.agent_id in state and "1 agent wait" in state
    assert "failed to build" not in state
