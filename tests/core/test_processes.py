"""docker-compose.yml cannot run here (no Docker engine): check it names what the Procfile runs."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def procfile() -> dict[str, str]:
    entries = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, command = line.split(":", 1)
            entries[name.strip()] = command.strip()
    return entries


def test_compose_runs_the_procfile_processes_with_the_same_commands():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "redis"} <= services.keys()
    for name, command in procfile().items():
        assert name in services, f"compose has no service {name!r}"
        assert services[name]["command"] == command, name


def test_the_procfile_has_web_worker_beat_and_flower():
    entries = procfile()
    assert set(entries) == {"web", "worker", "beat", "flower"}
    assert "asgi" in entries["web"]
