"""Several hosts in one test process: each "host" is its own data folder (clone, worktrees,
locks) over one central repository, served by `git daemon` on 127.0.0.1 (or read through
`file://` where the transport does not matter). Settings are switched to a host for a block."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from pytest_django.fixtures import Settings as SettingsWrapper

from psychonauts.workspaces.git import git
from psychonauts.workspaces.worktrees import demo_repo_ensure


@dataclass
class Central:
    """The central repository: a bare repository and the URL hosts use for it."""

    bare: Path
    url: str

    def tip(self, ref: str) -> str:
        proc = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", ref],
            cwd=self.bare,
            capture_output=True,
            text=True,
            check=False,
        )
        return proc.stdout.strip()

    def log(self, branch: str) -> list[str]:
        """The subjects of the branch's commits, newest first."""
        return git("log", "--format=%s", branch, cwd=self.bare).splitlines()


@dataclass
class Host:
    name: str
    home: Path
    settings: SettingsWrapper
    url: str

    @contextlib.contextmanager
    def active(self) -> Iterator[Host]:
        """The process is this host for the block (its data folder, clone and worktrees)."""
        saved = {
            k: getattr(self.settings, k)
            for k in (
                "ANNIHILATION_HOME",
                "ANNIHILATION_CLONE",
                "PSYCHONAUTS_WORKTREES",
                "ANNIHILATION_REPO",
                "ANNIHILATION_HOST",
            )
        }
        self.settings.ANNIHILATION_HOME = self.home
        self.settings.ANNIHILATION_CLONE = self.home / "clone"
        self.settings.PSYCHONAUTS_WORKTREES = self.home / "worktrees"
        self.settings.ANNIHILATION_REPO = self.url
        self.settings.ANNIHILATION_HOST = self.name
        try:
            yield self
        finally:
            for k, v in saved.items():
                setattr(self.settings, k, v)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bare_from_demo(tmp_path: Path) -> Path:
    seed = demo_repo_ensure(tmp_path / "seed")
    bare = tmp_path / "served" / "central.git"
    bare.parent.mkdir(parents=True)
    git("clone", "-q", "--bare", str(seed), str(bare), cwd=tmp_path)
    return bare


@pytest.fixture
def hosts_settings(
    settings: SettingsWrapper, tmp_path: Path, redis_client: redis.Redis
) -> SettingsWrapper:
    settings.PSYCHONAUTS_WORKSPACE_MODE = "worktree"
    settings.TETHER_TARGET_BRANCH = ""
    settings.ANNIHILATION_CENTRAL_RETRY_S = 5.0
    settings.ANNIHILATION_CENTRAL_LOCK_WAIT_S = 10.0
    settings.ANNIHILATION_HOME = tmp_path / "nohost"
    return settings


@pytest.fixture
def file_central(tmp_path: Path) -> Central:
    bare = _bare_from_demo(tmp_path)
    return Central(bare=bare, url=f"file://{bare}")


@pytest.fixture
def daemon_central(tmp_path: Path) -> Iterator[Central]:
    """The central repository behind `git daemon` (pushes allowed) on a free local port."""
    bare = _bare_from_demo(tmp_path)
    port = _free_port()
    proc = subprocess.Popen(
        [
            "git",
            "daemon",
            "--reuseaddr",
            "--listen=127.0.0.1",
            f"--port={port}",
            "--export-all",
            "--enable=receive-pack",
            f"--base-path={bare.parent}",
            str(bare.parent),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            break
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("git daemon did not start")
        time.sleep(0.05)
    yield Central(bare=bare, url=f"git://127.0.0.1:{port}/central.git")
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def make_host(hosts_settings: SettingsWrapper, tmp_path: Path) -> Callable[[str, Central], Host]:
    def make(name: str, central: Central) -> Host:
        return Host(name=name, home=tmp_path / name, settings=hosts_settings, url=central.url)

    return make
