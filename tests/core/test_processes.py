"""docker-compose.yml cannot run here (no Docker engine): check that it runs what the Procfile
runs, on an image the Dockerfile builds with what those processes need."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml
from celery.utils.nodenames import default_nodename, host_format

ROOT = Path(__file__).resolve().parents[2]
APP_SERVICES = ("migrate", "web", "worker", "beat", "flower")
CENTRAL_URL = "git://git/repo.git"


def procfile() -> dict[str, str]:
    entries = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, command = line.split(":", 1)
            entries[name.strip()] = command.strip()
    return entries


def compose_services() -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    return services


def test_compose_runs_the_procfile_processes_with_the_same_commands():
    services = compose_services()
    assert {"postgres", "redis", "git", *APP_SERVICES} <= services.keys()
    for name, command in procfile().items():
        assert name in services, f"compose has no service {name!r}"
        # In a container a process must listen on every interface to be reachable at all; its
        # port is published on the host's loopback only, as the Procfile's 127.0.0.1 means.
        # Compose runs the Procfile's ${PORT_VARIABLE:-default} (make dev's) on the default.
        command = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", command)
        assert services[name]["command"] == command.replace("127.0.0.1", "0.0.0.0"), name
        for port in services[name].get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)


def test_the_app_services_share_the_image_the_central_repository_and_the_migrated_database():
    services = compose_services()
    for name in APP_SERVICES:
        service = services[name]
        assert service["build"] == "." and service["image"] == "annihilation", name
        assert service["environment"]["ANNIHILATION_REPO"] == CENTRAL_URL, name
        assert service["depends_on"]["git"] == {"condition": "service_healthy"}, name
        assert not any(v.endswith(":/repo") for v in service["volumes"]), name
        if name != "migrate":
            assert service["depends_on"]["migrate"] == {
                "condition": "service_completed_successfully"
            }, name
    assert services["migrate"]["command"] == "python manage.py migrate --noinput"


def test_each_worker_replica_is_a_host_with_its_own_data():
    """`--scale worker=3`: the replicas share no data folder (each has the anonymous volume of
    the Dockerfile's VOLUME /data: its own clone and worktrees), the other services share
    `home`; each replica's Celery node name is its container's hostname, its default host."""
    services = compose_services()
    worker = services["worker"]
    assert worker["volumes"] == []
    assert "VOLUME /data" in (ROOT / "Dockerfile").read_text()
    assert "ANNIHILATION_HOST" not in worker["environment"]  # the container's name, per replica
    assert "-n worker@%h " in worker["command"]
    for name in set(APP_SERVICES) - {"worker"}:
        assert "home:/data" in services[name]["volumes"], name


def test_the_git_service_serves_the_central_repository_seeded_once_from_repo():
    services = compose_services()
    git_service = services["git"]
    assert git_service["image"] == "annihilation"
    assert "central:/srv/git" in git_service["volumes"]
    seed = "${REPO:?set REPO to the git repository the agents work on}:/seed:ro"
    assert seed in git_service["volumes"]
    assert "central" in yaml.safe_load((ROOT / "docker-compose.yml").read_text())["volumes"]
    script = git_service["command"][2]
    assert git_service["command"][:2] == ["sh", "-c"]
    assert "--enable=receive-pack" in script and "--base-path=/srv/git" in script
    health = git_service["healthcheck"]["test"]
    assert health[0] == "CMD" and health[-1] == "git://127.0.0.1/repo.git"
    assert CENTRAL_URL == "git://git/repo.git"  # the service's name, the daemon's base path


def test_the_dockerfile_installs_what_the_processes_need():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "FROM python:3.11" in dockerfile
    assert "install -y --no-install-recommends git" in dockerfile  # worktrees and merges
    # Editable, as `make install`: templates, pipelines and roles are read from the source tree.
    assert "pip install --no-cache-dir -e ." in dockerfile
    assert "collectstatic --noinput" in dockerfile  # DEBUG off serves static files from there
    assert "ANNIHILATION_HOME=/data" in dockerfile and "USER annihilation" in dockerfile
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".annihilation", ".git"} <= set(ignored)


def test_the_procfile_has_web_worker_beat_and_flower():
    entries = procfile()
    assert set(entries) == {"web", "worker", "beat", "flower"}
    assert "asgi" in entries["web"]


def test_make_dev_finds_the_procfile_programs_without_an_activated_venv():
    """honcho runs each Procfile line through /bin/sh with the PATH it was given: `make dev`
    gives it the venv's bin first, so a fresh checkout's daphne, celery and python are found."""
    bare = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    dry_run = subprocess.run(
        ["make", "-n", "--no-print-directory", "dev"],
        cwd=ROOT, env=bare, capture_output=True, text=True, check=True,
    ).stdout.replace("\\\n", " ")  # fmt: skip
    honcho = next(line for line in dry_run.splitlines() if line.rstrip().endswith("honcho start"))
    path = re.search(r'PATH="([^"]*)"', honcho)
    assert path is not None, honcho
    given = path.group(1).replace("$PATH", bare["PATH"])
    for name, command in procfile().items():
        program = command.split()[0]
        found = subprocess.run(
            ["/bin/sh", "-c", f"command -v {program}"],
            env={**bare, "PATH": given}, capture_output=True, text=True, check=False,
        ).stdout.strip()  # fmt: skip
        assert found == str(ROOT / ".venv" / "bin" / program), (name, found)


def test_flower_starts_through_the_command_that_requires_credentials():
    assert procfile()["flower"].startswith("python manage.py flower ")
    environment = compose_services()["flower"]["environment"]
    for name in ("ANNIHILATION_FLOWER_USER", "ANNIHILATION_FLOWER_PASSWORD"):
        assert environment[name] == f"${{{name}:?set {name}}}", name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(script: str, *, srv: Path, seed: Path, port: int) -> subprocess.Popen[bytes]:
    """The git service's command, run here: its folders moved under the test's, its daemon on
    the loopback (a container listens on every interface of its own)."""
    script = script.replace("/srv/git", str(srv)).replace("/seed", str(seed))
    script = script.replace("git daemon ", f"git daemon --listen=127.0.0.1 --port={port} ")
    proc = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    deadline = time.monotonic() + 15
    while subprocess.run(
        ["git", "ls-remote", "--heads", f"git://127.0.0.1:{port}/repo.git"],
        capture_output=True, check=False,
    ).returncode:  # fmt: skip
        assert proc.poll() is None, "the git service's command exited"
        assert time.monotonic() < deadline, "the git service never answered its healthcheck"
        time.sleep(0.1)
    return proc


def test_the_git_service_seeds_the_central_repository_once_and_takes_pushes(tmp_path: Path):
    def git(*args: str, cwd: Path) -> str:
        return subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, check=True
        ).stdout.strip()

    seed = tmp_path / "seed"
    seed.mkdir()
    git("init", "-q", "-b", "main", cwd=seed)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "seed",
        cwd=seed)  # fmt: skip
    srv, port = tmp_path / "srv", _free_port()
    srv.mkdir()
    script = compose_services()["git"]["command"][2]
    url = f"git://127.0.0.1:{port}/repo.git"
    proc = _serve(script, srv=srv, seed=seed, port=port)
    try:
        host = tmp_path / "host"
        git("clone", "-q", url, str(host), cwd=tmp_path)
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty",
            "-m", "an agent's", cwd=host)  # fmt: skip
        git("push", "-q", "origin", "HEAD:refs/heads/annihilation/q-1", cwd=host)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    # A restart keeps the volume's repository: the pushed branch stays, REPO is not read again.
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "later",
        cwd=seed)  # fmt: skip
    proc = _serve(script, srv=srv, seed=seed, port=port)
    try:
        heads = git("ls-remote", "--heads", url, cwd=tmp_path)
        assert "refs/heads/annihilation/q-1" in heads
        assert git("log", "--format=%s", "main", cwd=srv / "repo.git") == "seed"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)


def _node_name(command: str, env: dict[str, str]) -> str:
    """The Celery node name a Procfile line gives its worker: /bin/sh expands the line (as
    honcho runs it), then Celery expands `%h` to the machine's name."""
    argv = subprocess.run(
        ["/bin/sh", "-c", f'set -- {command}; printf "%s\\n" "$@"'],
        env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    return host_format(default_nodename(argv[argv.index("-n") + 1]))


def test_the_procfile_worker_is_named_after_its_host():
    """Several workers on one machine (network namespaces) each set ANNIHILATION_HOST: Flower
    and the dashboard list one node per host; unset, the node is named after the machine, as
    ANNIHILATION_HOST then is."""
    command = procfile()["worker"]
    assert _node_name(command, {"ANNIHILATION_HOST": "h2"}) == "worker@h2"
    assert _node_name(command, {}) == f"worker@{socket.gethostname()}"
    assert _node_name(command, {"ANNIHILATION_HOST": ""}) == f"worker@{socket.gethostname()}"
