"""Typed readers for settings that come from the environment.

Each helper fails loudly (ImproperlyConfigured) on a value it cannot read, naming the variable,
so a typo in the environment stops the process at start-up instead of misbehaving later.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use true/false, 1/0, yes/no)")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} must be at least {minimum}")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} must be at least {minimum}")
    return value


def env_path(name: str, default: Path) -> Path:
    raw = os.environ.get(name)
    return Path(raw).expanduser().resolve() if raw else default


def env_redis_url(name: str, default: str) -> str:
    url = os.environ.get(name, default)
    parts = urlsplit(url)
    if parts.scheme not in {"redis", "rediss", "unix"} or not (parts.hostname or parts.path):
        raise ImproperlyConfigured(f"{name}={url!r} is not a redis:// URL")
    return url


@dataclass(frozen=True)
class DatabaseURL:
    name: str
    user: str
    password: str
    host: str
    port: str

    def as_django(self) -> dict[str, Any]:
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": self.name,
            "USER": self.user,
            "PASSWORD": self.password,
            "HOST": self.host,
            "PORT": self.port,
            "CONN_MAX_AGE": 0,
            "ATOMIC_REQUESTS": False,
        }


def env_database_url(name: str, default: str) -> DatabaseURL:
    url = os.environ.get(name, default)
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql"}:
        raise ImproperlyConfigured(
            f"{name}: only postgres:// URLs are supported, got scheme {parts.scheme!r}"
        )
    db_name = parts.path.lstrip("/")
    if not db_name:
        raise ImproperlyConfigured(f"{name}={url!r} names no database (postgres://host:port/NAME)")
    try:
        port = parts.port
    except ValueError:
        raise ImproperlyConfigured(f"{name}={url!r} has an invalid port") from None
    return DatabaseURL(
        name=unquote(db_name),
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        host=parts.hostname or "",
        port=str(port or ""),
    )
