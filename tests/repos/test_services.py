"""The registry: the default repository, registering with bad input, removing, and which
repository new quanta, goals and waves belong to."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from psychonauts.workspaces.registration import repository_inspect
from psychonauts.workspaces.repository import repo_local
from psychonauts.workspaces.worktrees import demo_repo_ensure
from quanta.errors import InvalidQuantum
from quanta.models import Quantum
from quanta.services import quantum_close, quantum_create
from repos.context import current, working_on, working_on_quantum
from repos.errors import InvalidRepository, RepositoryInUse, RepositoryNotFound
from repos.models import Repository
from repos.selectors import repositories_list, repository_get
from repos.services import (
    repository_create,
    repository_default,
    repository_remove,
    repository_update,
)

pytestmark = pytest.mark.django_db


def add(name: str, path: Path, **fields: object) -> Repository:
    return repository_create(
        name=name,
        location=str(path),
        inspect=repository_inspect,
        **fields,  # type: ignore[arg-type]
    )


def test_it_makes_the_default_repository_from_annihilation_repo(repo: Path, settings) -> None:
    default = repository_default()

    assert default.is_default and default.name == "default"
    assert default.location == str(repo)
    assert repository_default().pk == default.pk  # once
    other = demo_repo_ensure(repo.parent / "moved")
    settings.ANNIHILATION_REPO = other
    assert repository_default().location == str(other)  # follows the setting


def test_quanta_belong_to_the_default_repository_unless_told(repo: Path, tmp_path: Path) -> None:
    second = add("second", demo_repo_ensure(tmp_path / "second"))

    plain = quantum_create(title="plain")
    there = quantum_create(title="there", repository_id=second.pk)
    child = quantum_create(title="child", parent_id=there.pk)
    with working_on(second):
        inside = quantum_create(title="filed while working on second")

    assert plain.repository_id == repository_default().pk
    assert [there.repository_id, child.repository_id, inside.repository_id] == [second.pk] * 3
    with pytest.raises(InvalidQuantum, match="no repository #999999"):
        quantum_create(title="nowhere", repository_id=999_999)


def test_the_current_repository_is_the_one_worked_on(repo: Path, tmp_path: Path) -> None:
    second_path = demo_repo_ensure(tmp_path / "second")
    second = add("second", second_path, target_branch="main", verify_commands=["make check"])
    quantum = quantum_create(title="q", repository_id=second.pk)

    assert repo_local() == repo and current().repository_id is None
    with working_on_quantum(quantum.pk):
        assert repo_local() == second_path
        assert (current().target_branch, current().verify_commands) == ("main", ("make check",))
    assert repo_local() == repo


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda tmp: str(tmp / "missing"), "is not a folder"),
        (lambda tmp: str(tmp), "is not a git repository"),
        (lambda tmp: "ftp://example.com/x.git", "unknown scheme"),
        (lambda tmp: "", "a location is required"),
    ],
)
def test_it_refuses_a_location_that_is_not_a_repository(repo, tmp_path, make, error) -> None:
    with pytest.raises(InvalidRepository, match=error):
        repository_create(name="bad", location=make(tmp_path), inspect=repository_inspect)
    assert not Repository.objects.filter(name="bad").exists()


def test_it_refuses_a_subfolder_of_a_repository(repo: Path) -> None:
    (repo / "sub" / ".git").mkdir(parents=True)  # looks like one, is not one
    with pytest.raises(InvalidRepository, match="top folder"):
        add("sub", repo / "sub")


def test_it_refuses_an_unknown_branch(repo: Path, tmp_path: Path) -> None:
    path = demo_repo_ensure(tmp_path / "second")
    with pytest.raises(InvalidRepository, match="has no branch 'release'"):
        add("second", path, target_branch="release")
    with pytest.raises(InvalidRepository, match="not a valid branch name"):
        add("second", path, target_branch="a..b")
    assert not Repository.objects.filter(name="second").exists()


def test_it_refuses_a_duplicate_or_bad_name(repo: Path, tmp_path: Path) -> None:
    path = demo_repo_ensure(tmp_path / "second")
    first = add("second", path)
    with pytest.raises(InvalidRepository, match="already registered"):
        add("second", path)
    with pytest.raises(InvalidRepository, match="lowercase"):
        add("Not Valid", path)
    assert list(Repository.objects.filter(name="second")) == [first]


def test_it_checks_the_environment_declaration(repo: Path, tmp_path: Path) -> None:
    path = demo_repo_ensure(tmp_path / "second")
    declared = "setup:\n  - python3 -m venv .venv\nlockfiles: [requirements.txt]\n"
    assert add("second", path, environment=declared).environment == declared
    assert add("third", path, environment='{"setup": ["npm ci"]}').environment
    with pytest.raises(InvalidRepository, match="environment declaration"):
        repository_update(name="second", environment="setup: [unclosed", inspect=repository_inspect)
    with pytest.raises(InvalidRepository, match="must be a mapping"):
        repository_update(name="second", environment="- a\n- b\n", inspect=repository_inspect)
    assert Repository.objects.get(name="second").environment == declared  # nothing lost


def test_removing_a_repository_with_open_quanta_is_refused_and_loses_nothing(
    repo: Path, tmp_path: Path
) -> None:
    second = add("second", demo_repo_ensure(tmp_path / "second"))
    quantum = quantum_create(title="open work", repository_id=second.pk)

    with pytest.raises(RepositoryInUse, match="1 open quanta"):
        repository_remove(name="second")
    assert repository_get(name="second") == second
    assert Quantum.objects.get(pk=quantum.pk).repository_id == second.pk

    quantum_close(quantum_id=quantum.pk, reason="done")
    removed = repository_remove(name="second")
    assert removed.removed_at is not None
    assert "second" not in [r.name for r in repositories_list()]
    assert Quantum.objects.get(pk=quantum.pk).repository_id == second.pk  # history stays
    with pytest.raises(RepositoryNotFound):
        repository_get(name="second")
    assert add("second", tmp_path / "second").pk != second.pk  # the name is free again


def test_the_default_repository_cannot_be_removed(repo: Path) -> None:
    repository_default()
    with pytest.raises(RepositoryInUse, match="default repository"):
        repository_remove(name="default")


def test_a_branch_is_checked_on_update(repo: Path, tmp_path: Path) -> None:
    path = demo_repo_ensure(tmp_path / "second")
    add("second", path)
    subprocess.run(["git", "branch", "release"], cwd=path, check=True)
    assert (
        repository_update(name="second", target_branch="release", inspect=repository_inspect)
    ).target_branch == "release"
    with pytest.raises(InvalidRepository, match="no branch 'gone'"):
        repository_update(name="second", target_branch="gone", inspect=repository_inspect)
    assert Repository.objects.get(name="second").target_branch == "release"
