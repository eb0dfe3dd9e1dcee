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

from django.core.checks.security.base import (
    SECRET_KEY_INSECURE_PREFIX,
    SECRET_KEY_MIN_LENGTH,
    SECRET_KEY_MIN_UNIQUE_CHARACTERS,
)
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


def _shown(url: str) -> str:
    """A URL for an error message: its password left out (settings load before the log
    redaction is installed)."""
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    return url.replace(f":{password}@", ":…(redacted)@", 1) if password else url


def env_redis_url(name: str, default: str) -> str:
    url = os.environ.get(name, default)
    parts = urlsplit(url)
    if parts.scheme not in {"redis", "rediss", "unix"} or not (parts.hostname or parts.path):
        raise ImproperlyConfigured(f"{name}={_shown(url)!r} is not a redis:// URL")
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
        raise ImproperlyConfigured(
            f"{name}={_shown(url)!r} names no database (postgres://host:port/NAME)"
        )
    try:
        port = parts.port
    except ValueError:
        raise ImproperlyConfigured(f"{name}={_shown(url)!r} has an invalid port") from None
    return DatabaseURL(
        name=unquote(db_name),
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        host=parts.hostname or "",
        port=str(port or ""),
    )


def env_csv(name: str, default: str) -> list[str]:
    """A comma-separated list; blanks around items and empty items are dropped."""
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def env_origins(name: str, default: str = "") -> list[str]:
    """Comma-separated origins, each exactly scheme://host[:port] (what Django compares the
    Origin header with): a path, a missing scheme or a typo would silently never match."""
    origins = env_csv(name, default)
    for origin in origins:
        parts = urlsplit(origin)
        try:
            parts.port  # noqa: B018  (raises on a port that is not a number)
        except ValueError:
            raise ImproperlyConfigured(f"{name}: {origin!r} has an invalid port") from None
        if (
            parts.scheme not in {"http", "https"}
            or not parts.netloc
            or parts.path not in {"", "/"}
            or parts.query
            or parts.fragment
            or "@" in parts.netloc
        ):
            raise ImproperlyConfigured(
                f"{name}: {origin!r} is not an origin (use scheme://host[:port], "
                "e.g. https://annihilation.example.com)"
            )
    return [origin.rstrip("/") for origin in origins]


def env_proxy_ssl_header(name: str) -> tuple[str, str] | None:
    """The header a TLS-terminating proxy sets to `https` (e.g. X-Forwarded-Proto), as Django's
    SECURE_PROXY_SSL_HEADER wants it; empty means no proxy is trusted. Only set it when the
    proxy always sets or strips that header: a client could otherwise claim https itself."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    if not all(c.isalnum() or c == "-" for c in raw):
        raise ImproperlyConfigured(
            f"{name}={raw!r} is not an HTTP header name (e.g. X-Forwarded-Proto)"
        )
    return ("HTTP_" + raw.upper().replace("-", "_"), "https")


def env_secret_key(name: str, *, debug: bool, debug_default: str) -> str:
    """The secret key. In DEBUG a development key stands in when none is set; otherwise the key
    must pass the test of Django's own deployment check (security.W009), so a weak key stops the
    process at start-up instead of being one warning among many."""
    key = os.environ.get(name, "")
    if debug:
        return key or debug_default
    if not key:
        raise ImproperlyConfigured(f"{name} must be set when DEBUG is off")
    if key.startswith(SECRET_KEY_INSECURE_PREFIX):
        why = f"starts with {SECRET_KEY_INSECURE_PREFIX!r} (a key Django generated for development)"
    elif len(key) < SECRET_KEY_MIN_LENGTH:
        why = f"is shorter than {SECRET_KEY_MIN_LENGTH} characters ({len(key)})"
    elif len(set(key)) < SECRET_KEY_MIN_UNIQUE_CHARACTERS:
        why = f"has fewer than {SECRET_KEY_MIN_UNIQUE_CHARACTERS} different characters"
    else:
        return key
    raise ImproperlyConfigured(
        f"{name} is too weak for DEBUG off: it {why}; generate one with "
        "python -c 'import secrets; print(secrets.token_urlsafe(50))'"
    )
