"""Settings, read from the environment (see the README for every variable).

Defaults point at the Postgres and Redis that `make services` starts, so a developer machine
needs no configuration at all.
"""

from __future__ import annotations

from pathlib import Path

import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured

from annihilation.env import (
    env_bool,
    env_database_url,
    env_float,
    env_int,
    env_path,
    env_redis_url,
    env_str,
)

# Lets admin and other generics be subscripted at runtime (ModelAdmin[Quantum]).
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env_bool("DEBUG", True)
SECRET_KEY = env_str("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off")
    SECRET_KEY = "dev-only-insecure-key-do-not-use-in-production"
ALLOWED_HOSTS = [h for h in env_str("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",") if h]

ANNIHILATION_HOME = env_path("ANNIHILATION_HOME", BASE_DIR / ".annihilation")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "channels",
    "django_htmx",
    "annihilation",
    "quanta",
    "psychonauts",
    "bursts",
    "tether",
    "reflection",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "annihilation.urls"
WSGI_APPLICATION = "annihilation.wsgi.application"
ASGI_APPLICATION = "annihilation.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": env_database_url(
        "DATABASE_URL", "postgres://postgres@127.0.0.1:55432/annihilation"
    ).as_django()
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# One Redis for hot state, the Celery broker and the channel layer unless split explicitly.
REDIS_URL = env_redis_url("REDIS_URL", "redis://127.0.0.1:56379/0")
CELERY_BROKER_URL = env_redis_url("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = env_redis_url("CELERY_RESULT_BACKEND", CELERY_BROKER_URL)
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_TASK_ALWAYS_EAGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_RESULT_EXPIRES = 3600

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL], "capacity": 1000, "expiry": 30},
    }
}

ANTHROPIC_API_KEY = env_str("ANTHROPIC_API_KEY", "")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
LOGIN_URL = "/admin/login/"

# Full-text search language for quanta and events (a Postgres text search configuration).
SEARCH_CONFIG = env_str("ANNIHILATION_SEARCH_CONFIG", "english")

# Burst manager defaults (the bursts app reads them).
WAVE_MAX_BURSTS = env_int("ANNIHILATION_WAVE_MAX_BURSTS", 100, minimum=1)
QUANTUM_MAX_CONSECUTIVE_FAILURES = env_int("ANNIHILATION_MAX_FAILURES", 3, minimum=1)
EVENT_SEND_TIMEOUT_S = env_float("ANNIHILATION_EVENT_SEND_TIMEOUT", 2.0, minimum=0.1)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "WARNING")},
    "loggers": {"annihilation": {"level": env_str("LOG_LEVEL", "INFO"), "propagate": True}},
}
