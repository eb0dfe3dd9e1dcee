from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from core import env

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
        *(
            ("CSRF_TRUSTED_ORIGINS", bad, lambda: env.env_origins("CSRF_TRUSTED_ORIGINS"), why)
            for bad, why in [
                ("annihilation.example.com", "not an origin"),
                ("https://ok.example.com,ftp://files.example.com", "not an origin"),
                ("https://annihilation.example.com/login/", "not an origin"),
                ("https://annihilation.example.com:port", "invalid port"),
            ]
        ),
        (
            "SECURE_PROXY_SSL_HEADER",
            "X-Forwarded-Proto: https",
            lambda: env.env_proxy_ssl_header("SECURE_PROXY_SSL_HEADER"),
            "not an HTTP header name",
        ),
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
    script = "from django.conf import settings as s; print(s.CELERY_BROKER_URL, s.CHANNEL_LAYERS['default']['CONFIG']['hosts'][0]['address'])"
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


def run_settings(env_vars: dict[str, str], code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        env={**env_vars, "DJANGO_SETTINGS_MODULE": "annihilation.settings"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def without(*names: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in names}


SECURITY_VARIABLES = (
    "DEBUG",
    "SECRET_KEY",
    "ALLOWED_HOSTS",
    "CSRF_TRUSTED_ORIGINS",
    "SECURE_SSL_REDIRECT",
    "SECURE_PROXY_SSL_HEADER",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
)

# The production environment the README documents, less what a deployment adds of its own.
PRODUCTION = {
    "DEBUG": "false",
    "SECRET_KEY": "k3Y-" + "x7Qp9Lm2Vr8Tz4Wn6Bc1Hd5Jf0Gs3Ka" * 2,
    "ALLOWED_HOSTS": "annihilation.example.com",
    "CSRF_TRUSTED_ORIGINS": "https://annihilation.example.com",
    "SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto",
}


def test_it_passes_the_deployment_check_in_the_documented_production_environment():
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        env={**without(*SECURITY_VARIABLES, "DJANGO_ALLOW_ASYNC_UNSAFE"), **PRODUCTION},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout
    assert "WARNING" not in result.stdout + result.stderr


def test_it_turns_every_protection_on_when_debug_is_off():
    code = (
        "from django.conf import settings as s; print(s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS,"
        " s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_PROXY_SSL_HEADER,"
        " s.CSRF_TRUSTED_ORIGINS)"
    )
    result = run_settings({**without(*SECURITY_VARIABLES), **PRODUCTION}, code)
    assert result.stdout.strip() == (
        "True 31536000 True True ('HTTP_X_FORWARDED_PROTO', 'https') "
        "['https://annihilation.example.com']"
    ), result.stderr


def test_it_keeps_development_working_with_nothing_set():
    code = (
        "from django.conf import settings as s; print(s.DEBUG, s.SECURE_SSL_REDIRECT,"
        " s.SECURE_HSTS_SECONDS, s.SESSION_COOKIE_SECURE, s.SECRET_KEY.startswith('dev-only'))"
    )
    result = run_settings(without(*SECURITY_VARIABLES), code)
    assert result.stdout.strip() == "True False 0 False True", result.stderr


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("x", "shorter than 50 characters"),
        (
            "django-insecure-" + "q8Zr2Lx7Vn4Tb1Wm6Kc9Hd3Jf5Gs0Ap" * 2,
            "starts with 'django-insecure-'",
        ),
        ("abcd" * 20, "fewer than 5 different characters"),
    ],
)
def test_it_refuses_a_weak_secret_key_without_debug_in_one_line(key, why):
    env_vars = {**without(*SECURITY_VARIABLES), **PRODUCTION, "SECRET_KEY": key}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        env=env_vars,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    (line,) = result.stderr.strip().splitlines()  # one line, no traceback
    assert line.startswith("manage.py: configuration error: SECRET_KEY ")
    assert why in line


def test_a_bad_database_url_is_named_without_its_password():
    env = {**os.environ, "DATABASE_URL": "postgres://app:hunter2-secret@db:99x/annihilation"}
    proc = subprocess.run(
        [sys.executable, "-c", "import annihilation.settings"], env=env,
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip

    assert proc.returncode != 0
    assert (
        "DATABASE_URL='postgres://app:…(redacted)@db:99x/annihilation' has an invalid port"
        in proc.stderr
    )
    assert "hunter2-secret" not in proc.stderr


@pytest.mark.parametrize("host", ["h1:7", "two words", "x" * 101])
def test_it_refuses_a_host_name_the_worker_field_cannot_carry(host):
    result = run_settings({**os.environ, "ANNIHILATION_HOST": host}, "pass")
    assert result.returncode != 0
    assert "ANNIHILATION_HOST" in result.stderr and "without ':' or whitespace" in result.stderr
