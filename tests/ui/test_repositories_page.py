"""The Repositories page: the registry for viewers, adding and removing for operators, errors
next to their field."""

from __future__ import annotations

from pathlib import Path

import pytest

from psychonauts.workspaces.worktrees import demo_repo_ensure
from quanta.services import quantum_create
from repos.models import Repository

pytestmark = pytest.mark.django_db


def test_a_viewer_sees_the_repositories_and_cannot_act(viewer_client, repo: Path) -> None:
    page = viewer_client.get("/repositories/")
    text = page.content.decode()
    assert page.status_code == 200 and 'data-name="default"' in text and str(repo) in text
    assert 'id="repository-add"' not in text
    assert viewer_client.post("/repositories/add/", {"name": "x"}).status_code == 403
    assert viewer_client.post("/repositories/default/remove/").status_code == 403


def test_an_operator_adds_and_removes_a_repository(op_client, repo: Path, tmp_path: Path) -> None:
    path = demo_repo_ensure(tmp_path / "second")
    added = op_client.post(
        "/repositories/add/",
        {
            "name": "second",
            "location": str(path),
            "target_branch": "main",
            "verify_commands": "python3 -m pytest -q\nruff check .\n",
            "environment": "setup:\n  - python3 -m venv .venv\n",
        },
        follow=True,
    )
    text = added.content.decode()
    assert "Added repository second." in text and 'data-name="second"' in text
    second = Repository.objects.get(name="second")
    assert second.verify_commands == ["python3 -m pytest -q", "ruff check ."]

    quantum_create(title="open", repository_id=second.pk)
    refused = op_client.post("/repositories/second/remove/", follow=True)
    assert refused.status_code == 409 and "1 open quanta" in refused.content.decode()
    assert Repository.objects.filter(name="second", removed_at__isnull=True).exists()


def test_bad_input_is_shown_next_to_its_field_and_nothing_is_added(
    op_client, repo: Path, tmp_path: Path
) -> None:
    path = demo_repo_ensure(tmp_path / "second")
    for data, message in (
        ({"name": "x", "location": str(tmp_path)}, "is not a git repository"),
        ({"name": "x", "location": str(path), "target_branch": "nope"}, "no branch"),
        ({"name": "x", "location": str(path), "environment": "- a list"}, "must be a mapping"),
    ):
        page = op_client.post("/repositories/add/", data)
        assert page.status_code == 400 and message in page.content.decode()
    assert not Repository.objects.filter(name="x").exists()


def test_the_dashboard_starts_a_wave_in_the_repository_chosen(
    op_client, repo: Path, tmp_path: Path
) -> None:
    from bursts.models import Wave
    from psychonauts.workspaces.registration import repository_inspect
    from repos.services import repository_create, repository_default

    second = repository_create(
        name="second", location=str(demo_repo_ensure(tmp_path / "second")),
        inspect=repository_inspect,
    )  # fmt: skip
    page = op_client.get("/").content.decode()
    assert '<option value="second">' in page

    op_client.post("/waves/start/", {"labels": "", "repository": "second"})
    op_client.post("/waves/start/", {"labels": ""})
    refused = op_client.post("/waves/start/", {"labels": "", "repository": "ghost"})

    assert refused.status_code == 400
    assert list(Wave.objects.order_by("pk").values_list("repository_id", flat=True)) == [
        second.pk,
        repository_default().pk,
    ]
