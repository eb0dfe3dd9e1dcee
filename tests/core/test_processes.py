"""docker-compose.yml cannot run here (no Docker engine): check that it runs what the Procfile
runs, on an image the Dockerfile builds with what those processes need."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
APP_SERVICES = ("migrate", "web", "worker", "beat", "flower")


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
    assert {"postgres", "redis", *APP_SERVICES} <= services.keys()
    for name, command in procfile().items():
        assert name in services, f"compose has no service {name!r}"
        # In a container a process must listen on every interface to be reachable at all; its
        # port is published on the host's loopback only, as the Procfile's 127.0.0.1 means.
        # Compose runs the Procfile's ${PORT_VARIABLE:-default} (make dev's) on the default.
        command = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", command)
        assert services[name]["command"] == command.replace("127.0.0.1", "0.0.0.0"), name
        for port in services[name].get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)


def test_the_app_services_share_the_image_the_data_and_the_migrated_database():
    services = compose_services()
    for name in APP_SERVICES:
        service = services[name]
        assert service["build"] == "." and service["image"] == "annihilation", name
        assert "home:/data" in service["volumes"], name
        assert service["environment"]["ANNIHILATION_REPO"] == "/repo", name
        if name != "migrate":
            assert service["depends_on"]["migrate"] == {
                "condition": "service_completed_successfully"
            }, name
    assert services["migrate"]["command"] == "python manage.py migrate --noinput"


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
