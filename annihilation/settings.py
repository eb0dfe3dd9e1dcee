"""Settings, read from the environment (see the README for every variable).

Defaults point at the Postgres and Redis that `make services` starts, so a developer machine
needs no configuration at all.
"""

from __future__ import annotations

import importlib.util
import re
import socket
import sys
from datetime import timedelta
from pathlib import Path

import django_stubs_ext
from csp.constants import NONE as CSP_NONE
from csp.constants import SELF as CSP_SELF
from django.core.exceptions import ImproperlyConfigured

from core.env import (
    env_bool,
    env_csv,
    env_database_url,
    env_float,
    env_int,
    env_origins,
    env_path,
    env_proxy_ssl_header,
    env_redis_url,
    env_secret_key,
    env_str,
)
from core.locations import location_parse

# Lets admin and other generics be subscripted at runtime (ModelAdmin[Quantum]).
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env_bool("DEBUG", True)
SECRET_KEY = env_secret_key(
    "SECRET_KEY", debug=DEBUG, debug_default="dev-only-insecure-key-do-not-use-in-production"
)
ALLOWED_HOSTS = env_csv("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")

ANNIHILATION_HOME = env_path("ANNIHILATION_HOME", BASE_DIR / ".annihilation")

# The project's apps, bottom floor first: each imports only those before it.
PROJECT_APPS = [
    "core",
    "repos",
    "quanta",
    "bursts",
    "psychonauts",
    "tether",
    "reflection",
    "autopilot",
    "forges",
    "operations",
    "hooks",
    "api",
    "annihilation",
]

# daphne's app only gives `manage.py runserver` its ASGI server (HTTP and websockets); the web
# process is daphne itself (Procfile). Listed for runserver alone, since loading it imports
# Twisted's server into every process (commands, workers) for nothing.
_RUNSERVER = sys.argv[1:2] == ["runserver"]

# django-ninja's API docs page is served from its own template and static files (its CDN page's
# inline script breaks the CSP), found here without importing the package: listed as an app it
# would be imported, with pydantic, by every process at start-up (api.api.Docs renders it).
_NINJA_SPEC = importlib.util.find_spec("ninja")
if _NINJA_SPEC is None or _NINJA_SPEC.origin is None:
    raise ImproperlyConfigured("django-ninja is not installed")
_NINJA_DIR = Path(_NINJA_SPEC.origin).parent

INSTALLED_APPS = [
    *(["daphne"] if _RUNSERVER else []),
    # The admin without its autodiscovery at start-up: annihilation.urls registers the apps'
    # admin modules (and what they import) when the URLs load, so a command or a worker, which
    # serves no page, does not load them.
    "django.contrib.admin.apps.SimpleAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "channels",
    "django_htmx",
    "csp",
    "axes",
    *PROJECT_APPS,
]

MIDDLEWARE = [
    # First: a request id on every log record of the request (the other middleware's too) and
    # on the response (core.logs).
    "core.logs.RequestIdMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "core.security.ContentSecurityPolicyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Turns a login refused for too many failures into the lockout page (axes' own position).
    "axes.middleware.AxesMiddleware",
]

# Axes first: it refuses a locked-out username and address before any password is checked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

# --- security ---
# Production defaults follow DEBUG: with it off every browser-facing protection is on and
# `manage.py check --deploy` is clean; each can be changed from the environment.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG)
# A supervisor's or load balancer's probe talks plain HTTP to the web process itself.
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
# Behind a TLS-terminating proxy Django sees plain HTTP: name the header the proxy sets to
# `https` (e.g. X-Forwarded-Proto), or the redirect above would loop.
SECURE_PROXY_SSL_HEADER = env_proxy_ssl_header("SECURE_PROXY_SSL_HEADER")
# How many proxies in front of the web process append to X-Forwarded-For: the client's address
# (login throttling and lockout) is read that many entries from the right of the header, the
# proxy's own REMOTE_ADDR counting as the last. 0: REMOTE_ADDR, the header ignored (a client
# could write anything in it).
TRUSTED_PROXIES = env_int("ANNIHILATION_TRUSTED_PROXIES", 0, minimum=0)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 365 * 24 * 3600, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", not DEBUG)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", not DEBUG)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
# The origins a form may be posted from when they differ from the Host (a proxy that rewrites it).
CSRF_TRUSTED_ORIGINS = env_origins("CSRF_TRUSTED_ORIGINS")
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# Scripts and styles come from our static files only (no inline code, no attributes): an
# injected <script> or onclick= does not run. connect-src also gets ws(s)://<host> per request
# (core.security). The admin's own templates pass this policy as they are.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [CSP_SELF],
        "script-src": [CSP_SELF],
        "style-src": [CSP_SELF],
        "img-src": [CSP_SELF],
        "connect-src": [CSP_SELF],
        "object-src": [CSP_NONE],
        "base-uri": [CSP_SELF],
        "form-action": [CSP_SELF],
        "frame-ancestors": [CSP_NONE],
    }
}
# Login throttling (django-axes): this many failures for one username from one address lock
# that pair out for the cool-off; each further failure restarts it, a success clears the count.
AXES_FAILURE_LIMIT = env_int("ANNIHILATION_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(seconds=env_float("ANNIHILATION_LOGIN_COOLOFF_S", 900.0, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "core.security.login_lockout_response"
AXES_CLIENT_IP_CALLABLE = "core.security.client_address"
# Flower (`manage.py flower`) refuses to start without these: it can shut workers down.
FLOWER_USER = env_str("ANNIHILATION_FLOWER_USER", "")
FLOWER_PASSWORD = env_str("ANNIHILATION_FLOWER_PASSWORD", "")
# Or Flower's own `user:password[,user:password]`, used when the two above are unset.
FLOWER_BASIC_AUTH = env_str("FLOWER_BASIC_AUTH", "")
# The password `manage.py demo` gives its operator account.
DEMO_PASSWORD = env_str("ANNIHILATION_DEMO_PASSWORD", "annihilation")

ROOT_URLCONF = "annihilation.urls"
WSGI_APPLICATION = "annihilation.wsgi.application"
ASGI_APPLICATION = "annihilation.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates", _NINJA_DIR / "templates"],
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
# A pool of connections per process (psycopg_pool through Django). A threads worker runs a
# hundred agents that each touch the database for milliseconds between minute-long LLM calls:
# they hand their connection back during a call and take a warm one after it. Without the pool
# each call meant a new Postgres backend (a fork, costly in server CPU) or a hundred idle ones held.
# 0 turns pooling off (one connection per thread, closed at the end of each request or task).
DB_POOL_MAX = env_int("ANNIHILATION_DB_POOL_MAX", 20, minimum=0)
# Parameters bound by the server, and a statement run this many times on a connection prepared
# there: planning the agent loop's statements afresh each time was 40% of Postgres's time for
# them (bench/agents_concurrency.py, pg_stat_statements). Pooled or not, connections are ours
# alone (no transaction-mode pooler in between, which prepared statements would not survive).
DB_PREPARE_THRESHOLD = env_int("ANNIHILATION_DB_PREPARE_THRESHOLD", 2, minimum=0)
DATABASES["default"]["OPTIONS"] = {
    "server_side_binding": True,
    "prepare_threshold": DB_PREPARE_THRESHOLD or None,
}
if DB_POOL_MAX:
    DATABASES["default"]["OPTIONS"]["pool"] = {
        "min_size": 1,
        "max_size": DB_POOL_MAX,
        "timeout": 30,
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# One Redis for hot state, the Celery broker and the channel layer unless split explicitly.
REDIS_URL = env_redis_url("REDIS_URL", "redis://127.0.0.1:56379/0")
CELERY_BROKER_URL = env_redis_url("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = env_redis_url("CELERY_RESULT_BACKEND", CELERY_BROKER_URL)
# kombu's Redis transport with one client per channel instead of one per message (core/broker.py);
# a TLS or unix-socket broker keeps kombu's own.
if CELERY_BROKER_URL.startswith("redis://"):
    CELERY_BROKER_TRANSPORT = "core.broker:Transport"
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_TASK_ALWAYS_EAGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_RESULT_EXPIRES = 3600

# A live page's consumer waits for its next event in a blocking read of up to 5 s
# (channels_redis's BZPOPMIN, RedisChannelLayer.brpop_timeout). A socket timeout at or below that
# (redis-py 8's default is 5 s) ends every idle websocket with 1011, so it is set here, well
# above the blocking read, whatever the client library's default.
CHANNEL_LAYER_SOCKET_TIMEOUT_S = 30
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            "hosts": [{"address": REDIS_URL, "socket_timeout": CHANNEL_LAYER_SOCKET_TIMEOUT_S}],
            "capacity": 1000,
            "expiry": 30,
        },
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
# In DEBUG, serve straight from the apps (no collectstatic); in production run collectstatic.
WHITENOISE_USE_FINDERS = DEBUG
WHITENOISE_AUTOREFRESH = DEBUG
LOGIN_URL = "/admin/login/"

# Full-text search language for quanta and events (a Postgres text search configuration).
SEARCH_CONFIG = env_str("ANNIHILATION_SEARCH_CONFIG", "english")
# `quanta search` (best match first) ranks a broad query (one in ten of the newest quanta match
# it) over this many of its newest matches, every match of any other.
SEARCH_RANK_CANDIDATES = env_int("ANNIHILATION_SEARCH_RANK_CANDIDATES", 1000, minimum=1)

# Burst manager defaults (the bursts app reads them).
WAVE_MAX_BURSTS = env_int("ANNIHILATION_WAVE_MAX_BURSTS", 100, minimum=1)
QUANTUM_MAX_CONSECUTIVE_FAILURES = env_int("ANNIHILATION_MAX_FAILURES", 3, minimum=1)
EVENT_SEND_TIMEOUT_S = env_float("ANNIHILATION_EVENT_SEND_TIMEOUT", 2.0, minimum=0.1)

# Every process logs to stderr: one JSON object per record with LOG_FORMAT=json, a readable line
# otherwise (text); each record redacted and carrying the request, task, wave, quantum and agent
# ids known where it was logged (core.logs).
LOG_FORMAT = env_str("LOG_FORMAT", "text")
if LOG_FORMAT not in {"json", "text"}:
    raise ImproperlyConfigured("LOG_FORMAT must be 'json' or 'text'")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"()": "core.logs.TextFormatter"},
        "json": {"()": "core.logs.JsonFormatter"},
    },
    "filters": {
        "redact": {"()": "core.redaction.RedactingFilter"},
        "context": {"()": "core.logs.ContextFilter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": LOG_FORMAT,
            "filters": ["redact", "context"],
        }
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "WARNING")},
    # The project's apps and Celery's own (a worker's and beat's start-up, tasks sent and done,
    # as Celery logs them by default) at INFO; everything else at the root's level.
    "loggers": {
        name: {"level": env_str("LOG_LEVEL", "INFO"), "propagate": True}
        for name in (*PROJECT_APPS, "celery")
    },
}


def _repo_setting(raw: str, default: Path) -> Path | str:
    """ANNIHILATION_REPO: a URL (`scheme://...`, or scp-like `user@host:path`) stays a str, as
    written; anything else is a local path, made absolute. ImproperlyConfigured for garbage."""
    raw = raw.strip()
    if not raw:
        return default
    try:
        return location_parse(raw, what=f"ANNIHILATION_REPO={raw!r}")
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from None


# --- psychonauts ---
# The agent runtime (psychonauts app). Workspaces live under ANNIHILATION_HOME unless placed
# elsewhere; the target repository is any git repository (the demo creates a small one here
# when missing).
# A local path (a Path), or a central repository's URL (a str): see `# --- hosts ---`.
ANNIHILATION_REPO: Path | str = _repo_setting(
    env_str("ANNIHILATION_REPO", ""), ANNIHILATION_HOME / "repo"
)
PSYCHONAUTS_WORKTREES = env_path("ANNIHILATION_WORKTREES", ANNIHILATION_HOME / "worktrees")
# "worktree": one git worktree per quantum; "shared": every agent in ANNIHILATION_REPO itself,
# writes guarded by file leases.
PSYCHONAUTS_WORKSPACE_MODE = env_str("ANNIHILATION_WORKSPACE_MODE", "worktree")
if PSYCHONAUTS_WORKSPACE_MODE not in {"worktree", "shared"}:
    raise ImproperlyConfigured("ANNIHILATION_WORKSPACE_MODE must be 'worktree' or 'shared'")
# Overrides every role's provider when set (e.g. `anthropic` to run the demo wave on Claude).
PSYCHONAUTS_PROVIDER = env_str("ANNIHILATION_PROVIDER", "")
# Model routing by quantum complexity. A trivial quantum whose body gives its steps as shell
# commands runs them without a model (the `shell` provider) when PSYCHONAUTS_TRIVIAL_NO_LLM is on.
PSYCHONAUTS_MODELS = {
    "trivial": env_str("ANNIHILATION_MODEL_TRIVIAL", "claude-haiku-4-5"),
    "standard": env_str("ANNIHILATION_MODEL_STANDARD", "claude-sonnet-4-6"),
    "complex": env_str("ANNIHILATION_MODEL_COMPLEX", "claude-opus-4-6"),
}
PSYCHONAUTS_TRIVIAL_NO_LLM = env_bool("ANNIHILATION_TRIVIAL_NO_LLM", True)
# USD per million tokens (input, output); unknown models cost the default.
PSYCHONAUTS_PRICES = {
    "claude-haiku-4-5": (1.0, 5.0),
    "claude-sonnet-4-6": (3.0, 15.0),
    "claude-opus-4-6": (5.0, 25.0),
    "scripted": (0.0, 0.0),
    "noop": (0.0, 0.0),
    "shell": (0.0, 0.0),
}
PSYCHONAUTS_QUANTUM_RUN_BUDGET_USD = env_float(
    "ANNIHILATION_QUANTUM_RUN_BUDGET_USD", 5.0, minimum=0
)
# Loops (psychonauts.runtime.loops): an agent is stopped when the same call returns the same result this
# many times, or after this many turns in a row that only repeat calls made before.
PSYCHONAUTS_LOOP_REPEATS = env_int("ANNIHILATION_LOOP_REPEATS", 3, minimum=2)
PSYCHONAUTS_LOOP_WINDOW = env_int("ANNIHILATION_LOOP_WINDOW", 8, minimum=2)
# Cache breakpoints on the anthropic provider's requests (psychonauts.routing.providers.caching).
PSYCHONAUTS_PROMPT_CACHE = env_bool("ANNIHILATION_PROMPT_CACHE", True)
PSYCHONAUTS_MAX_TOKENS = env_int("ANNIHILATION_MAX_TOKENS", 4096, minimum=1)
PSYCHONAUTS_PROVIDER_RETRIES = env_int("ANNIHILATION_PROVIDER_RETRIES", 4, minimum=1)
PSYCHONAUTS_RETRY_BASE_S = env_float("ANNIHILATION_RETRY_BASE_S", 1.0, minimum=0)
# Recursion: spawn depth limit and the global semaphore of concurrently running sub-agents.
PSYCHONAUTS_SPAWN_DEPTH = env_int("ANNIHILATION_SPAWN_DEPTH", 3, minimum=0)
PSYCHONAUTS_SPAWN_SLOTS = env_int("ANNIHILATION_SPAWN_SLOTS", 16, minimum=1)
PSYCHONAUTS_SLOT_TTL_S = env_float("ANNIHILATION_SLOT_TTL_S", 60.0, minimum=1)
PSYCHONAUTS_SLOT_WAIT_S = env_float("ANNIHILATION_SLOT_WAIT_S", 600.0, minimum=0)
PSYCHONAUTS_LEASE_TTL_S = env_float("ANNIHILATION_LEASE_TTL_S", 300.0, minimum=1)
# The beat removes the worktrees of closed quanta this often (their branches stay).
PSYCHONAUTS_WORKSPACE_SWEEP_S = env_float("ANNIHILATION_WORKSPACE_SWEEP_S", 60.0, minimum=1)
PSYCHONAUTS_SHELL_TIMEOUT_S = env_float("ANNIHILATION_SHELL_TIMEOUT_S", 120.0, minimum=1)
# The grep tool's whole search (a catastrophic expression fails the call after this long).
PSYCHONAUTS_GREP_TIMEOUT_S = env_float("ANNIHILATION_GREP_TIMEOUT_S", 5.0, minimum=0.1)
PSYCHONAUTS_OUTPUT_LIMIT = env_int("ANNIHILATION_OUTPUT_LIMIT", 20_000, minimum=100)
PSYCHONAUTS_TEXT_FLUSH_S = env_float("ANNIHILATION_TEXT_FLUSH_S", 0.5, minimum=0)
PSYCHONAUTS_ROLE_DIR = BASE_DIR / "psychonauts" / "roles"
PSYCHONAUTS_SCRIPT_DIRS = [BASE_DIR / "psychonauts" / "scripts"] + [
    Path(p) for p in env_str("ANNIHILATION_SCRIPT_DIRS", "").split(":") if p
]
# The agent sandbox (psychonauts/containment/sandbox.py): "on" runs every command an agent starts in
# bubblewrap, and refuses agents that run commands where it cannot start; "off" runs them
# unconfined (a deliberate choice, shown on the dashboard).
SANDBOX_MODE = env_str("ANNIHILATION_SANDBOX", "on").strip().lower()
if SANDBOX_MODE not in {"on", "off"}:
    raise ImproperlyConfigured("ANNIHILATION_SANDBOX must be 'on' or 'off'")
SANDBOX_BWRAP = env_str("ANNIHILATION_SANDBOX_BWRAP", "bwrap")
SANDBOX_NETWORK = env_bool("ANNIHILATION_SANDBOX_NETWORK", False)
SANDBOX_PATH = env_str(
    "ANNIHILATION_SANDBOX_PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)
# A root worker runs each quantum's commands as uid BASE + a slot of its own (0..100000, held
# in Postgres: psychonauts/containment/identities.py): an id range no account or subordinate-id range of the
# machine uses. A slot left unrenewed this long may go to another holder when none is free.
SANDBOX_UID_BASE = env_int("ANNIHILATION_SANDBOX_UID_BASE", 1_500_000_000, minimum=1000)
SANDBOX_UID_STALE_S = env_int("ANNIHILATION_SANDBOX_UID_STALE_S", 86_400, minimum=3600)
SANDBOX_CPU_S = env_int("ANNIHILATION_SANDBOX_CPU_S", 600, minimum=1)
# The memory of one command: all its processes together plus its /tmp and /dev/shm (a
# watchdog samples them every SANDBOX_SAMPLE_S and kills the command over the limit; each
# process is also held to it by its data limit).
SANDBOX_MEMORY_BYTES = env_int("ANNIHILATION_SANDBOX_MEMORY_MB", 2048, minimum=16) * 2**20
SANDBOX_SAMPLE_S = env_float("ANNIHILATION_SANDBOX_SAMPLE_S", 0.1, minimum=0.01)
# What a worktree may hold (its files and folders, .git aside): a command that takes it past
# either limit is killed (checked during the command and after it).
SANDBOX_WORKTREE_BYTES = env_int("ANNIHILATION_SANDBOX_WORKTREE_MB", 2048, minimum=1) * 2**20
SANDBOX_WORKTREE_FILES = env_int("ANNIHILATION_SANDBOX_WORKTREE_FILES", 100_000, minimum=10)
SANDBOX_PROCESSES = env_int("ANNIHILATION_SANDBOX_PROCESSES", 256, minimum=8)
SANDBOX_FILE_BYTES = env_int("ANNIHILATION_SANDBOX_FILE_MB", 1024, minimum=1) * 2**20
SANDBOX_TMP_BYTES = env_int("ANNIHILATION_SANDBOX_TMP_MB", 512, minimum=1) * 2**20
SANDBOX_OUTPUT_BYTES = env_int("ANNIHILATION_SANDBOX_OUTPUT_KB", 4096, minimum=1) * 2**10
# More folders mounted empty inside the sandbox (colon-separated), e.g. /srv/secrets:/opt/keys
# (the worker's home and every installation's folders are hidden already).
SANDBOX_HIDE = [
    Path(p).expanduser() for p in env_str("ANNIHILATION_SANDBOX_HIDE", "").split(":") if p
]
# The host's registry of installations: each one lists its folders there (data, worktrees,
# clone, repository, checkout), and every installation's sandbox hides all of them.
SANDBOX_REGISTRY = env_path(
    "ANNIHILATION_SANDBOX_REGISTRY", Path("/var/tmp/annihilation-installations")
)
# Repositories' environments (psychonauts/environments): built folders live here, outside
# every worktree; the operator's own declaration for the default repository (a YAML file, it
# wins over the repository's `.annihilation/environment.yaml`); a build's time and size limits;
# how many built folders and for how long unused ones are kept.
ENV_ROOT = env_path("ANNIHILATION_ENV_ROOT", ANNIHILATION_HOME / "environments")
ENV_DECLARATION = env_str("ANNIHILATION_ENV_DECLARATION", "")
ENV_BUILD_TIMEOUT_S = env_float("ANNIHILATION_ENV_BUILD_TIMEOUT_S", 1800.0, minimum=1)
ENV_MAX_BYTES = env_int("ANNIHILATION_ENV_MAX_MB", 4096, minimum=1) * 2**20
ENV_KEEP = env_int("ANNIHILATION_ENV_KEEP", 8, minimum=1)
ENV_KEEP_DAYS = env_float("ANNIHILATION_ENV_KEEP_DAYS", 14.0, minimum=0)
# Hosts agents' own commands may reach, through the worker's egress proxy (none by default).
AGENT_NETWORK = [h.lower() for h in env_csv("ANNIHILATION_AGENT_NETWORK", "")]
# Caution-tier shell commands allowed by rule (regexes matched against each command part).
PSYCHONAUTS_COMMAND_ALLOW = [r for r in env_str("ANNIHILATION_COMMAND_ALLOW", "").split("|||") if r]
# A quantum's verify commands: each may run this long (then it is killed and counts as failed).
VERIFY_TIMEOUT_S = env_float("ANNIHILATION_VERIFY_TIMEOUT_S", 300.0, minimum=1)
# What the runtime never commits, beyond the repository's own .gitignore: gitignore patterns
# (colon-separated) added to the built-in list of caches, virtualenvs and build outputs.
COMMIT_EXCLUDE_EXTRA = [p for p in env_str("ANNIHILATION_COMMIT_EXCLUDE", "").split(":") if p]

# --- bursts ---
# What the stage tasks run: "psychonauts" (the executor registered behind bursts.executor's seam:
# the agent runtime) or "noop" (finishes every agent at once: benchmarks of the manager alone).
BURSTS_EXECUTOR = env_str("ANNIHILATION_BURSTS_EXECUTOR", "psychonauts")
if BURSTS_EXECUTOR not in ("psychonauts", "noop"):
    raise ImproperlyConfigured(
        f"ANNIHILATION_BURSTS_EXECUTOR={BURSTS_EXECUTOR!r}: expected psychonauts or noop"
    )
# A running agent's lease in Redis lives this long unless its worker renews it (every third).
# A stage whose agents all ended and whose run has not stepped for this long is stepped by the
# safety net (its chord callback was lost).
BURSTS_HEARTBEAT_TTL_S = env_float("ANNIHILATION_HEARTBEAT_TTL_S", 30.0, minimum=0.3)
# A stage with no sign of life for this long is sent to Celery again (lost message, dead worker).
BURSTS_DISPATCH_GRACE_S = env_float("ANNIHILATION_DISPATCH_GRACE_S", 120.0, minimum=0.3)
BURSTS_SAFETY_NET_INTERVAL_S = env_float("ANNIHILATION_SAFETY_NET_INTERVAL_S", 5.0, minimum=0.1)
# Celery's Django fixup closes the database connection after every task unless told to reuse
# it. Pooled (DB_POOL_MAX), closing hands it back to the pool, which every thread of a threads
# worker must be able to do: 0. Unpooled, a new connection (a Postgres backend fork) costs more
# than a no-op stage: workers keep theirs for this many tasks, and
# core/celery.py drops one that broke.
CELERY_DB_REUSE_MAX = env_int("ANNIHILATION_DB_REUSE_MAX", 0 if DB_POOL_MAX else 1000, minimum=0)
# A lost worker's unacknowledged task comes back after this long (Redis broker); the safety net
# usually re-dispatches first, and a redelivered task finds its work done and returns.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env_int("ANNIHILATION_VISIBILITY_TIMEOUT_S", 3600, minimum=1)
}

# --- ui ---
# The control room: login everywhere (views opt out with @login_not_required), the
# operator/viewer roles (core.access), static files of the live script, nav context.
MIDDLEWARE = [*MIDDLEWARE, "django.contrib.auth.middleware.LoginRequiredMiddleware"]
TEMPLATES[0]["OPTIONS"]["context_processors"].append("annihilation.views.dashboard.ui_context")  # type: ignore[index]
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"
STATICFILES_DIRS = [BASE_DIR / "static", _NINJA_DIR / "static"]
FLOWER_URL = env_str("ANNIHILATION_FLOWER_URL", "http://127.0.0.1:5555")
UI_PAGE_SIZE = env_int("ANNIHILATION_UI_PAGE_SIZE", 50, minimum=1)
# Seconds the dashboard's whole-table totals (quanta by status, all-time spend) are shared
# between renders through Redis; 0 counts them on every render.
DASHBOARD_TOTALS_TTL_S = env_float("ANNIHILATION_DASHBOARD_TOTALS_TTL_S", 2.0, minimum=0)

# --- tether ---
# A reaching's timeout when the agent names none, and the longest it may ask for.
TETHER_DEFAULT_TIMEOUT_S = env_float("ANNIHILATION_TETHER_TIMEOUT_S", 300.0, minimum=0.5)
TETHER_MAX_TIMEOUT_S = env_float("ANNIHILATION_TETHER_MAX_TIMEOUT_S", 86400.0, minimum=1)
# How long a pipeline proposal and a quarantine question wait for the operator.
TETHER_MUTATION_TIMEOUT_S = env_float("ANNIHILATION_TETHER_MUTATION_TIMEOUT_S", 3600.0, minimum=1)
TETHER_QUARANTINE_TIMEOUT_S = env_float(
    "ANNIHILATION_TETHER_QUARANTINE_TIMEOUT_S", 86400.0, minimum=1
)
# Merge low-risk changes without the operator (off: every change waits for a decision).
TETHER_AUTO_MERGE_LOW_RISK = env_bool("ANNIHILATION_TETHER_AUTO_MERGE_LOW_RISK", False)
# The branch approved changes merge into; empty = the branch the target repository has out.
TETHER_TARGET_BRANCH = env_str("ANNIHILATION_TETHER_TARGET_BRANCH", "")
# The most characters of a change's (redacted) diff a review stores and shows; the rest is cut
# with a note saying how much (git still merges the whole branch).
TETHER_DIFF_LIMIT = env_int("ANNIHILATION_TETHER_DIFF_LIMIT", 500_000, minimum=1000)
# The beat sweep: overdue reachings and proposals, lost wakeups, a queue Redis lost, lost reviews.
TETHER_SWEEP_INTERVAL_S = env_float("ANNIHILATION_TETHER_SWEEP_INTERVAL_S", 2.0, minimum=0.1)
# Seconds a done run's change review may stay due (its task not yet done) before the sweep sends
# the task again: a message lost with a worker or the broker. A review resent while the first
# one still runs is harmless (one review per run).
TETHER_REVIEW_RESEND_S = env_float("ANNIHILATION_TETHER_REVIEW_RESEND_S", 600.0, minimum=1)
# The merge queue runs these on every merged result as well as the quantum's own verify commands
# (the target's checks: e.g. the whole test suite), separated by `|||`.
TETHER_VERIFY_COMMANDS = [
    c.strip() for c in env_str("ANNIHILATION_TETHER_VERIFY_COMMANDS", "").split("|||") if c.strip()
]

# --- autopilot ---
# The hub's beat tick (it starts paused on a fresh installation: resume it to let it act).
AUTOPILOT_TICK_S = env_float("ANNIHILATION_AUTOPILOT_TICK_S", 10.0, minimum=0.5)
# Daily budgets (USD) of what the autopilot's own work may spend, in all and per hub state; a
# model call that would go over waits (held, no worker) until the budget allows again.
AUTOPILOT_BUDGET_DAY_USD = env_float("ANNIHILATION_AUTOPILOT_BUDGET_DAY_USD", 20.0, minimum=0)
AUTOPILOT_BUDGET_STATE_USD = {
    "executing": env_float("ANNIHILATION_AUTOPILOT_BUDGET_EXECUTING_USD", 15.0, minimum=0),
    "improving": env_float("ANNIHILATION_AUTOPILOT_BUDGET_IMPROVING_USD", 3.0, minimum=0),
    "contemplating": env_float("ANNIHILATION_AUTOPILOT_BUDGET_CONTEMPLATING_USD", 1.0, minimum=0),
    "healing": env_float("ANNIHILATION_AUTOPILOT_BUDGET_HEALING_USD", 2.0, minimum=0),
}
# The global cap (USD per day, every agent's spend, the operator's included; 0 = none): reached,
# it pauses every agent at its next model call and the autopilot, until the next day or a
# higher cap.
SPEND_CAP_DAY_USD = env_float("ANNIHILATION_SPEND_CAP_DAY_USD", 0.0, minimum=0)
# Decomposition: the most quanta one plan may file, and the planner's tries at a valid plan.
AUTOPILOT_PLAN_MAX_QUANTA = env_int("ANNIHILATION_AUTOPILOT_PLAN_MAX_QUANTA", 20, minimum=1)
AUTOPILOT_PLAN_TRIES = env_int("ANNIHILATION_AUTOPILOT_PLAN_TRIES", 3, minimum=1)
# Healing: an agent with no new turn for this long is stuck (cancelled and requeued); this many
# failed checks of the integration branch in a row file a healing quantum; this many provider
# failures of one endpoint in a row mark it down for the given time.
AUTOPILOT_STUCK_S = env_float("ANNIHILATION_AUTOPILOT_STUCK_S", 900.0, minimum=1)
AUTOPILOT_BASE_CHECK_S = env_float("ANNIHILATION_AUTOPILOT_BASE_CHECK_S", 600.0, minimum=1)
AUTOPILOT_BASE_FAILURES = env_int("ANNIHILATION_AUTOPILOT_BASE_FAILURES", 2, minimum=1)
AUTOPILOT_ENDPOINT_FAILURES = env_int("ANNIHILATION_AUTOPILOT_ENDPOINT_FAILURES", 3, minimum=1)
AUTOPILOT_ENDPOINT_DOWN_S = env_float("ANNIHILATION_AUTOPILOT_ENDPOINT_DOWN_S", 300.0, minimum=1)
# Improving: how often the scanners run when idle, what they file per pass, and the window in
# which the same finding on the same file is not filed again (nor a line a merge just wrote).
AUTOPILOT_SCAN_EVERY_S = env_float("ANNIHILATION_AUTOPILOT_SCAN_EVERY_S", 3600.0, minimum=1)
AUTOPILOT_SCAN_MAX_FILED = env_int("ANNIHILATION_AUTOPILOT_SCAN_MAX_FILED", 5, minimum=1)
AUTOPILOT_FINDING_WINDOW_S = env_float(
    "ANNIHILATION_AUTOPILOT_FINDING_WINDOW_S", 7 * 86400.0, minimum=0
)
AUTOPILOT_LONG_FUNCTION_LINES = env_int("ANNIHILATION_AUTOPILOT_LONG_FUNCTION_LINES", 80, minimum=5)
# The target repository's linter and tests, run in the sandbox by the scanners ("" = skip):
# lint output lines `path:line[:col]: message` are findings; a failing test command is one.
AUTOPILOT_SCAN_LINT_COMMAND = env_str("ANNIHILATION_AUTOPILOT_SCAN_LINT_COMMAND", "")
AUTOPILOT_SCAN_TEST_COMMAND = env_str("ANNIHILATION_AUTOPILOT_SCAN_TEST_COMMAND", "")
# Contemplating: how often an agent may propose goals, and how many may wait for approval.
AUTOPILOT_CONTEMPLATE_EVERY_S = env_float(
    "ANNIHILATION_AUTOPILOT_CONTEMPLATE_EVERY_S", 86400.0, minimum=1
)
AUTOPILOT_PROPOSALS_MAX = env_int("ANNIHILATION_AUTOPILOT_PROPOSALS_MAX", 5, minimum=0)
# Low-risk changes of the autopilot's own quanta merge without the operator (through the merge
# queue, verified on the merged result); the operator's own changes follow TETHER_AUTO_MERGE_*.
AUTOPILOT_AUTO_MERGE_LOW_RISK = env_bool("ANNIHILATION_AUTOPILOT_AUTO_MERGE_LOW_RISK", False)

# --- reflection ---
# A rule's confidence halves over this many days without feedback (the daily decay sweep).
REFLECTION_HALF_LIFE_DAYS = env_float("ANNIHILATION_REFLECTION_HALF_LIFE_DAYS", 30.0, minimum=0.1)
# Promotion on feedback: (helpful count, confidence) a rule needs to become established / proven.
REFLECTION_PROMOTE_ESTABLISHED = (
    env_int("ANNIHILATION_REFLECTION_ESTABLISHED_HELPFUL", 3, minimum=1),
    env_float("ANNIHILATION_REFLECTION_ESTABLISHED_CONFIDENCE", 0.6, minimum=0),
)
REFLECTION_PROMOTE_PROVEN = (
    env_int("ANNIHILATION_REFLECTION_PROVEN_HELPFUL", 10, minimum=1),
    env_float("ANNIHILATION_REFLECTION_PROVEN_CONFIDENCE", 0.8, minimum=0),
)
# Demotion: a harmful feedback that leaves a rule's confidence below this deprecates it (decay
# alone only lowers confidence: a rule is deprecated on evidence of harm, not on silence).
REFLECTION_DEMOTE_BELOW = env_float("ANNIHILATION_REFLECTION_DEMOTE_BELOW", 0.3, minimum=0)
for _name, _value in (
    ("ANNIHILATION_REFLECTION_ESTABLISHED_CONFIDENCE", REFLECTION_PROMOTE_ESTABLISHED[1]),
    ("ANNIHILATION_REFLECTION_PROVEN_CONFIDENCE", REFLECTION_PROMOTE_PROVEN[1]),
    ("ANNIHILATION_REFLECTION_DEMOTE_BELOW", REFLECTION_DEMOTE_BELOW),
):
    if _value > 1:
        raise ImproperlyConfigured(f"{_name} is a confidence: at most 1, not {_value}")
# A rule failing at least this often (and more than twice as often as it helps) inverts into
# an anti-pattern ("Avoid: ...").
REFLECTION_ANTI_PATTERN_MIN_FAILURES = env_int(
    "ANNIHILATION_REFLECTION_ANTI_PATTERN_MIN_FAILURES", 3, minimum=1
)
# How a skill is chosen among the matching ones: thompson (sampling), ucb1 or mean (posterior).
REFLECTION_SKILL_POLICY = env_str("ANNIHILATION_REFLECTION_SKILL_POLICY", "thompson").strip()
if REFLECTION_SKILL_POLICY not in ("thompson", "ucb1", "mean"):
    raise ImproperlyConfigured(
        "ANNIHILATION_REFLECTION_SKILL_POLICY must be 'thompson', 'ucb1' or 'mean'"
    )
# A proposed rule needs evidence from at least this many sessions to be accepted.
REFLECTION_EVIDENCE_MIN_SESSIONS = env_int(
    "ANNIHILATION_REFLECTION_EVIDENCE_MIN_SESSIONS", 2, minimum=1
)
# The most playbook rules injected into one agent's prompt.
REFLECTION_INJECT_TOP_K = env_int("ANNIHILATION_REFLECTION_INJECT_TOP_K", 5, minimum=0)
# How often the decay sweep runs (seconds; daily by default).
REFLECTION_DECAY_EVERY_S = env_float("ANNIHILATION_REFLECTION_DECAY_EVERY_S", 86400.0, minimum=60)

# --- endpoints ---
# The registry of model endpoints (psychonauts.routing.endpoints): health checks, concurrency.
# The longest wait for a model endpoint's next bytes (seconds): a server that stops answering
# mid-stream fails the call after this (retried by the provider, then counted as a failure).
ENDPOINTS_TIMEOUT_S = env_float("ANNIHILATION_ENDPOINTS_TIMEOUT_S", 120.0, minimum=0.1)
# How often the beat checks every enabled endpoint (a models list; a tiny request for one that
# is down), and how long one check may take.
ENDPOINTS_HEALTH_EVERY_S = env_float("ANNIHILATION_ENDPOINTS_HEALTH_EVERY_S", 60.0, minimum=1)
ENDPOINTS_HEALTH_TIMEOUT_S = env_float("ANNIHILATION_ENDPOINTS_HEALTH_TIMEOUT_S", 10.0, minimum=0.1)
# How long a failed check keeps an endpoint down when no later check says otherwise (routing
# takes it again after this even if the beat stopped).
ENDPOINTS_DOWN_S = env_float("ANNIHILATION_ENDPOINTS_DOWN_S", 600.0, minimum=1)
# How long a model call waits for a free slot of its endpoint (max concurrency) before failing.
ENDPOINTS_SLOT_WAIT_S = env_float("ANNIHILATION_ENDPOINTS_SLOT_WAIT_S", 300.0, minimum=0)
# Rate limits (psychonauts.routing.ratelimits): how often a call refused for load is asked
# again (and how often its run may be suspended for one), the longest wait a call takes in its
# worker for a retry-after (a longer one suspends the run, holding no worker, until it is over), the longest
# retry-after honoured, and how long a lowered concurrency is remembered.
ENDPOINTS_RATE_LIMIT_TRIES = env_int("ANNIHILATION_ENDPOINTS_RATE_LIMIT_TRIES", 6, minimum=1)
ENDPOINTS_RETRY_AFTER_MAX_S = env_float("ANNIHILATION_ENDPOINTS_RETRY_AFTER_MAX_S", 60.0, minimum=0)
ENDPOINTS_RETRY_AFTER_LONGEST_S = env_float(
    "ANNIHILATION_ENDPOINTS_RETRY_AFTER_LONGEST_S", 3600.0, minimum=0
)
# The most calls at once to the endpoint of a provider's own settings (not of the registry:
# ANTHROPIC_BASE_URL, OPENAI_BASE_URL), across every worker; rate limits lower it.
ENDPOINTS_SETTINGS_CONCURRENCY = env_int(
    "ANNIHILATION_ENDPOINTS_SETTINGS_CONCURRENCY", 256, minimum=1
)
ENDPOINTS_LIMIT_MEMORY_S = env_float("ANNIHILATION_ENDPOINTS_LIMIT_MEMORY_S", 600.0, minimum=1)
# How long a process keeps its copy of the registry (seconds) before reading it again.
ENDPOINTS_CACHE_S = env_float("ANNIHILATION_ENDPOINTS_CACHE_S", 5.0, minimum=0)
# Where an endpoint's key may be sent (core.destinations): never to a link-local or cloud
# metadata address; to loopback or a private network (a local model server) only with this on.
# On by default with DEBUG (a developer machine); in production turn it on for a model server
# on the local network.
ENDPOINTS_ALLOW_PRIVATE = env_bool("ANNIHILATION_ENDPOINTS_ALLOW_PRIVATE", DEBUG)
# The environment variables an endpoint's api_key_env may name (comma-separated; a trailing `*`
# matches any end): the worker's other secrets (its database URL, a webhook's signing secret,
# cloud credentials) can never be sent to an endpoint.
ENDPOINTS_KEY_ENVS = env_csv(
    "ANNIHILATION_ENDPOINTS_KEY_ENVS",
    "ANTHROPIC_API_KEY,OPENAI_API_KEY,VLLM_API_KEY,OLLAMA_API_KEY,ANNIHILATION_ENDPOINT_KEY_*",
)

# --- api ---
# The HTTP API (api app): tokens, rate limits, idempotency, incoming webhooks.
# Token buckets per API token and per action (core.ratelimit): this many requests a minute,
# all of them at once at most. Reads are GETs; writes are every other method.
API_READS_PER_MIN = env_int("ANNIHILATION_API_READS_PER_MIN", 600, minimum=1)
API_WRITES_PER_MIN = env_int("ANNIHILATION_API_WRITES_PER_MIN", 60, minimum=1)
# Login attempts (POSTs to /login/ and /admin/login/) per client address a minute; django-axes
# still locks out a username after ANNIHILATION_LOGIN_FAILURE_LIMIT failures.
LOGIN_ATTEMPTS_PER_MIN = env_int("ANNIHILATION_LOGIN_ATTEMPTS_PER_MIN", 100, minimum=1)
# How long the first response to an Idempotency-Key is kept and replayed.
API_IDEMPOTENCY_RETENTION_H = env_int("ANNIHILATION_API_IDEMPOTENCY_HOURS", 24, minimum=1)
# Page size of listings when the client gives no `limit`, and the most it may ask for.
API_PAGE_SIZE = env_int("ANNIHILATION_API_PAGE_SIZE", 50, minimum=1)
API_PAGE_MAX = env_int("ANNIHILATION_API_PAGE_MAX", 500, minimum=1)
# The largest request body the API reads (bytes; an import carries its whole file).
API_BODY_MAX_BYTES = env_int("ANNIHILATION_API_BODY_MAX_BYTES", 8 * 2**20, minimum=1024)
# How often the beat forgets idempotent responses older than the retention (seconds).
API_IDEMPOTENCY_PURGE_EVERY_S = env_float(
    "ANNIHILATION_API_IDEMPOTENCY_PURGE_S", 3600.0, minimum=60
)

# --- operations ---
# Metrics and alerts (operations app).
# Every process (web, workers, beat) writes its metrics to files here (prometheus-client's
# multiprocess mode) and /metrics adds them up; the files of processes that died are folded
# into one archive per type by the alerter's tick, so counters never go back.
METRICS_DIR = env_path("PROMETHEUS_MULTIPROC_DIR", ANNIHILATION_HOME / "prometheus")
# When set, /metrics wants `Authorization: Bearer <token>` (Prometheus' `authorization`
# block); empty, it answers anyone who can reach the web process.
METRICS_TOKEN = env_str("ANNIHILATION_METRICS_TOKEN", "")
# The alerter's beat tick: it samples the figures the Metrics page charts and evaluates the
# alert rules; samples older than OPERATIONS_SAMPLES_KEEP_S are deleted.
OPERATIONS_TICK_S = env_float("ANNIHILATION_OPERATIONS_TICK_S", 30.0, minimum=1)
OPERATIONS_SAMPLES_KEEP_S = env_float("ANNIHILATION_OPERATIONS_SAMPLES_KEEP_S", 3600.0, minimum=60)
# How long a worker ping waits for answers (start_wave, the dashboard, the alerter).
OPERATIONS_PING_TIMEOUT_S = env_float("ANNIHILATION_PING_TIMEOUT_S", 1.0, minimum=0.05)
# `start_wave --follow` repeats its no-worker warning this often while work waits.
OPERATIONS_WARN_EVERY_S = env_float("ANNIHILATION_WARN_EVERY_S", 10.0, minimum=0.1)
# Rates (errors, spend) are measured over this window of samples.
ALERT_WINDOW_S = env_float("ANNIHILATION_ALERT_WINDOW_S", 300.0, minimum=10)
# Each rule fires when its figure reaches its threshold and resolves when it drops below; a
# rule that fired does not fire again within its cooldown (seconds) of that firing, so a
# flapping figure sends one alert, not one per tick. Env: ANNIHILATION_ALERT_<RULE>_THRESHOLD
# and ANNIHILATION_ALERT_<RULE>_COOLDOWN_S (RULE upper-cased).
ALERT_RULES = {
    rule: {
        "threshold": env_float(
            f"ANNIHILATION_ALERT_{rule.upper()}_THRESHOLD", threshold, minimum=0
        ),
        "cooldown_s": env_float(f"ANNIHILATION_ALERT_{rule.upper()}_COOLDOWN_S", 600.0, minimum=0),
    }
    for rule, threshold in (
        ("no_worker", 1.0),  # tasks waiting in a queue no worker consumes
        ("queue_backlog", 100.0),  # tasks waiting in one queue
        ("error_rate", 5.0),  # errors per minute over ALERT_WINDOW_S
        ("stuck_agents", 1.0),  # running agents without a heartbeat for ALERT_STUCK_AFTER_S
        ("budget_burn", 10.0),  # USD per hour over ALERT_WINDOW_S
        ("endpoint_down", 1.0),  # model endpoints marked down
        ("question_waiting", 1800.0),  # seconds the oldest Tether question has waited
        ("review_waiting", 1800.0),  # seconds the oldest change review has been due
        ("cache_miss", 0.5),  # share of input tokens not read from cache over ALERT_WINDOW_S
    )
}
# A running agent whose heartbeat is older than this counts as stuck.
ALERT_STUCK_AFTER_S = env_float("ANNIHILATION_ALERT_STUCK_AFTER_S", 600.0, minimum=1)

# --- hooks ---
# Outgoing and incoming webhooks (hooks app).
# GitHub's deliveries (/hooks/github): the secret GitHub signs them with (empty: every delivery
# is refused with 503), the largest body accepted (bytes), the branch whose pushes wake the
# scheduler and whose failed checks file healing quanta (empty: the Tether's target branch),
# and the label that makes an issue a quantum.
HOOKS_GITHUB_SECRET = env_str("ANNIHILATION_GITHUB_WEBHOOK_SECRET", "")
HOOKS_GITHUB_MAX_BYTES = env_int("ANNIHILATION_GITHUB_WEBHOOK_MAX_BYTES", 2 * 2**20, minimum=1)
HOOKS_GITHUB_BASE_BRANCH = env_str("ANNIHILATION_GITHUB_BASE_BRANCH", "")
HOOKS_GITHUB_ISSUE_LABEL = env_str("ANNIHILATION_GITHUB_ISSUE_LABEL", "annihilation")
# Outgoing: how often the beat reads new events into deliveries (seconds), how many events one
# pass reads, and how long a gap in the event ids holds the outbox's cursor (an id drawn by a
# transaction that rolled back never appears).
HOOKS_OUTBOX_EVERY_S = env_float("ANNIHILATION_HOOKS_OUTBOX_S", 2.0, minimum=0.1)
HOOKS_OUTBOX_BATCH = env_int("ANNIHILATION_HOOKS_OUTBOX_BATCH", 10000, minimum=1)
HOOKS_OUTBOX_GAP_S = env_float("ANNIHILATION_HOOKS_OUTBOX_GAP_S", 300.0, minimum=1)

# --- forges (pull requests; docs/pull-requests.md) ---
# The client's retries of a forge call (5xx, connection errors, rate-limit 403s) and the first
# backoff (doubled each time); its timeout; the longest wait for a rate limit's reset.
FORGES_RETRIES = env_int("ANNIHILATION_FORGES_RETRIES", 4, minimum=0)
FORGES_BACKOFF_S = env_float("ANNIHILATION_FORGES_BACKOFF_S", 0.5, minimum=0)
FORGES_TIMEOUT_S = env_float("ANNIHILATION_FORGES_TIMEOUT_S", 15.0, minimum=1)
FORGES_MAX_RATE_WAIT_S = env_float("ANNIHILATION_FORGES_MAX_RATE_WAIT_S", 60.0, minimum=0)
# Our own pace per forge repository, shared by every worker: CAPACITY calls per PERIOD_S.
FORGES_RATE_CAPACITY = env_int("ANNIHILATION_FORGES_RATE_CAPACITY", 80, minimum=1)
FORGES_RATE_PERIOD_S = env_float("ANNIHILATION_FORGES_RATE_PERIOD_S", 60.0, minimum=0.001)
# The poll of open pull requests where no deliveries come (seconds between looks at one).
FORGES_POLL_S = env_float("ANNIHILATION_FORGES_POLL_S", 60.0, minimum=1)
# The same look where deliveries come, as a safety net for one GitHub failed to make.
FORGES_WEBHOOK_POLL_S = env_float("ANNIHILATION_FORGES_WEBHOOK_POLL_S", 900.0, minimum=1)
# Where the pull request's links to quanta, goals and drifts point (blank: relative paths).
FORGES_LINK_BASE = env_str("ANNIHILATION_PUBLIC_URL", "")
# A delivery's attempts: the POST's timeout, the backoff after the n-th failure
# (base * 2^(n-1), at most max), the attempts before it is failed, and how late a retry may be
# before the outbox's sweep sends it again (its task was lost).
HOOKS_TIMEOUT_S = env_float("ANNIHILATION_HOOKS_TIMEOUT_S", 10.0, minimum=0.1)
HOOKS_RETRY_BASE_S = env_float("ANNIHILATION_HOOKS_RETRY_BASE_S", 10.0, minimum=0)
HOOKS_RETRY_MAX_S = env_float("ANNIHILATION_HOOKS_RETRY_MAX_S", 3600.0, minimum=0)
HOOKS_MAX_ATTEMPTS = env_int("ANNIHILATION_HOOKS_MAX_ATTEMPTS", 8, minimum=1)
HOOKS_SWEEP_GRACE_S = env_float("ANNIHILATION_HOOKS_SWEEP_GRACE_S", 60.0, minimum=0)
# Outgoing webhooks never go to a link-local or cloud metadata address; to loopback or a private
# network only with this on (on by default with DEBUG, a developer machine).
HOOKS_ALLOW_PRIVATE = env_bool("ANNIHILATION_WEBHOOKS_ALLOW_PRIVATE", DEBUG)

# --- hosts ---
# Several worker hosts. ANNIHILATION_HOST names this process's host in the agent registry, the
# dashboard and Flower: the machine's name unless set (hosts that share a machine name, such as
# network namespaces or containers, set it). No ":" nor whitespace: an agent run's worker is
# "<host>:<pid>:<thread>".
ANNIHILATION_HOST = env_str("ANNIHILATION_HOST", "") or socket.gethostname()
if not re.fullmatch(r"[^\s:]{1,100}", ANNIHILATION_HOST):
    raise ImproperlyConfigured(
        f"ANNIHILATION_HOST={ANNIHILATION_HOST!r}: a host name of at most 100 characters, "
        "without ':' or whitespace"
    )
# The central repository: when ANNIHILATION_REPO is a URL, each host works in its own clone of
# it (made on first use), fetches a quantum's branch before a stage and pushes after each
# agent's commit, fenced (docs/hosts.md). A local path: everything stays on this host.
ANNIHILATION_CLONE = env_path("ANNIHILATION_CLONE", ANNIHILATION_HOME / "clone")
# How long a fetch or push to the central repository is retried through network failures, and
# how long an agent waits for its quantum's cross-host commit lock (Redis) before it fails.
ANNIHILATION_CENTRAL_RETRY_S = env_float("ANNIHILATION_CENTRAL_RETRY_S", 60.0, minimum=0)
ANNIHILATION_CENTRAL_LOCK_WAIT_S = env_float("ANNIHILATION_CENTRAL_LOCK_WAIT_S", 120.0, minimum=0)

# Beat's record of last runs: in the data folder, not the current directory.
CELERY_BEAT_SCHEDULE_FILENAME = str(ANNIHILATION_HOME / "celerybeat-schedule")
# The beat's periodic tasks; each expires after its own period (the next one is due by then).
CELERY_BEAT_SCHEDULE = {
    name: {"task": task, "schedule": every, "options": {"expires": every}}
    for name, task, every in (
        (
            "psychonauts-workspaces-sweep",
            "psychonauts.workspaces_sweep",
            PSYCHONAUTS_WORKSPACE_SWEEP_S,
        ),
        ("bursts-safety-net", "bursts.safety_net", BURSTS_SAFETY_NET_INTERVAL_S),
        ("psychonauts-environment-waiters", "psychonauts.environment_waiters_sweep", 30.0),
        ("tether-sweep", "tether.sweep", TETHER_SWEEP_INTERVAL_S),
        ("autopilot-tick", "autopilot.tick", AUTOPILOT_TICK_S),
        ("reflection-decay", "reflection.decay", REFLECTION_DECAY_EVERY_S),
        ("hooks-outbox", "hooks.outbox", HOOKS_OUTBOX_EVERY_S),
        ("endpoints-health", "psychonauts.endpoints_health", ENDPOINTS_HEALTH_EVERY_S),
        ("psychonauts-rate-limited-resume", "psychonauts.rate_limited_resume", 15.0),
        ("operations-tick", "operations.tick", OPERATIONS_TICK_S),
        ("api-idempotency-purge", "api.idempotency_purge", API_IDEMPOTENCY_PURGE_EVERY_S),
        ("forges-poll", "forges.poll", FORGES_POLL_S / 2),
    )
}

# --- hostile input ---
# The most an import file, an upload, a pipeline, role or script file may hold (bytes); a larger
# one is refused before it is read in full.
IMPORT_MAX_BYTES = env_int("ANNIHILATION_IMPORT_MAX_BYTES", 5 * 2**20, minimum=1)
# A form post of up to the import limit must reach the form (a pasted pipeline is a form field,
# up to three times longer once URL-encoded) so that its size is reported next to the field;
# only a far larger body gets Django's bare 400.
DATA_UPLOAD_MAX_MEMORY_SIZE = max(2_621_440, 3 * IMPORT_MAX_BYTES + 2**20)

# --- redaction ---
# More secret patterns for core.redaction (regular expressions separated by `|||`): each
# match, or its first group when it has groups, is redacted wherever the built-in ones are.
# Checked when the apps load: an invalid expression stops the process.
REDACT_EXTRA_PATTERNS = [
    p for p in env_str("ANNIHILATION_REDACT_PATTERNS", "").split("|||") if p.strip()
]
