from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from annihilation import env

ROOT = Path(__file__).resolve().parents[2]


def test_database_url_is_parsed(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://u:p%40ss@db.example:6543/name")
    url = env.env_database_url("DATABASE_URL", "")
    assert (url.user, url.password, url.host, url.port, url.name) == (
        "u",
        "p@ss",
        "db.example",
        "6543",
        "name",
    )


@pytest.mark.parametrize(
    ("name", "value", "reader", "message"),
    [
        ("DEBUG", "maybe", lambda: env.env_bool("DEBUG", True), "not a boolean"),
        ("N", "ten", lambda: env.env_int("N", 1), "not an integer"),
        ("N", "0", lambda: env.env_int("N", 1, minimum=1), "at least 1"),
        (
            "DATABASE_URL",
            "mysql://x/y",
            lambda: env.env_database_url("DATABASE_URL", ""),
            "only postgres",
        ),
        (
            "DATABASE_URL",
            "postgres://host:5432",
            lambda: env.env_database_url("DATABASE_URL", ""),
            "names no database",
        ),
        ("REDIS_URL", "http://x", lambda: env.env_redis_url("REDIS_URL", ""), "not a redis:// URL"),
    ],
)
def test_bad_values_fail_loudly_naming_the_variable(monkeypatch, name, value, reader, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(ImproperlyConfigured, match=message) as exc:
        reader()
    assert name in str(exc.value)


def test_secret_key_is_required_without_debug():
    env_vars = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY"}}
    env_vars["DEBUG"] = "false"
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env={**env_vars, "DJANGO_SETTINGS_MODULE": "annihilation.settings"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0 and "SECRET_KEY must be set" in result.stderr


def test_broker_and_channel_layer_derive_from_redis_url():
    script = "from django.conf import settings as s; print(s.CELERY_BROKER_URL, s.CHANNEL_LAYERS['default']['CONFIG']['hosts'][0])"
    result = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {script}"],
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "annihilation.settings",
            "REDIS_URL": "redis://10.0.0.9:6379/3",
        },
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.split() == ["redis://10.0.0.9:6379/3", "redis://10.0.0.9:6379/3"]


@pytest.mark.parametrize(
    ("worktrees", "expected"),
    [(None, "/srv/annihilation/worktrees"), ("/fast/worktrees", "/fast/worktrees")],
)
def test_worktrees_live_under_home_unless_placed_elsewhere(worktrees, expected):
    env_vars = {k: v for k, v in os.environ.items() if k != "ANNIHILATION_WORKTREES"}
    env_vars["ANNIHILATION_HOME"] = "/srv/annihilation"
    if worktrees:
        env_vars["ANNIHILATION_WORKTREES"] = worktrees
    script = "from django.conf import settings as s; print(s.PSYCHONAUTS_WORKTREES)"
    result = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {script}"],
        env={**env_vars, "DJANGO_SETTINGS_MODULE": "annihilation.settings"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == expected
