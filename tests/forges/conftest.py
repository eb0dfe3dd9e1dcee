"""Fixtures of the pull request tests: the default repository publishing to a fake GitHub on
loopback (its git side a bare clone of the test's repository), a token in the worker's
environment only, and quick retries."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bursts.models import Burst, QuantumRun, RunStatus, Wave
from forges.models import ForgeRepository
from forges.services import forge_configure
from psychonauts.workspaces.repository import branch_for
from psychonauts.workspaces.worktrees import workspace_commit, workspace_ensure
from quanta.models import Quantum, QuantumStatus
from repos.services import repository_default
from tests.fakes.github_server import FakeGitHub, github_served
from tests.psychonauts.conftest import make_quantum, scripts
from tests.tether.conftest import tether_settings, tether_worker

__all__ = ["make_quantum", "scripts", "tether_settings", "tether_worker"]

TOKEN = "github_pat_" + "Zq7" * 27 + "x"


@pytest.fixture
def forge_settings(tether_settings: Any) -> Any:
    tether_settings.FORGES_RETRIES = 2
    tether_settings.FORGES_BACKOFF_S = 0.01
    tether_settings.FORGES_TIMEOUT_S = 5.0
    tether_settings.FORGES_RATE_CAPACITY = 1000
    tether_settings.FORGES_LINK_BASE = "https://annihilation.example"
    return tether_settings


@pytest.fixture
def github(
    repo: Path, tmp_path: Path, forge_settings: Any, monkeypatch: Any
) -> Iterator[FakeGitHub]:
    bare = tmp_path / "forge.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", str(repo), str(bare)], check=True)
    monkeypatch.setenv("ACME_GITHUB_TOKEN", TOKEN)
    with github_served(bare) as fake:
        yield fake


@pytest.fixture
def forge(github: FakeGitHub, db: None) -> ForgeRepository:
    return forge_configure(
        repository_id=repository_default().pk,
        slug=github.slug,
        token_env="ACME_GITHUB_TOKEN",
        api_url=github.url,
        push_url=str(github.bare),
    )


def done_run(quantum: Quantum, files: dict[str, str], wave: Wave | None = None) -> QuantumRun:
    """A done run of the quantum (closed, as the drain leaves it) whose agent committed
    `files` on its branch."""
    wave = wave or Wave.objects.create(status="done")
    burst = Burst.objects.get_or_create(wave=wave, number=1, defaults={"phase": "done"})[0]
    run = QuantumRun.objects.create(
        wave=wave, burst=burst, quantum=quantum, status=RunStatus.DONE,
        branch=branch_for(quantum.pk),
    )  # fmt: skip
    tree = workspace_ensure(quantum_id=quantum.pk)
    for name, text in files.items():
        path = tree / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    workspace_commit(workspace=tree, quantum_id=quantum.pk, agent_id="test", role="coder")
    Quantum.objects.filter(pk=quantum.pk).update(status=QuantumStatus.CLOSED)
    return run


MakeQuantum = Callable[..., Quantum]
