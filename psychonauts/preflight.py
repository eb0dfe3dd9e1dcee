"""The configuration mistakes a new operator makes first, each found before any work starts and
told in one line that says what to do: a provider without its key, a repository that is not
there. Commands call these before they create runs or waves."""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings

from bursts.executor import executor_current
from psychonauts.models import Role
from psychonauts.routing.providers import PROVIDERS
from psychonauts.runtime.entry import agent_run


def provider_of(*, role: str, provider: str = "") -> str:
    """The provider an agent of `role` would use: the one asked for, else ANNIHILATION_PROVIDER,
    else the role's own (the runtime's order)."""
    if provider:
        return provider
    if settings.PSYCHONAUTS_PROVIDER:
        return str(settings.PSYCHONAUTS_PROVIDER)
    own = Role.objects.filter(name=role).values_list("provider", flat=True).first()
    return own or ""


def provider_problem(name: str) -> str | None:
    """Why `name` cannot make a model call from this process, or None."""
    if not name:
        return None
    if name not in PROVIDERS:
        return f"unknown provider {name!r} (known: {', '.join(sorted(PROVIDERS))})"
    if name == "anthropic" and not (
        os.environ.get("ANTHROPIC_API_KEY") or settings.ANTHROPIC_API_KEY
    ):
        return (
            "the anthropic provider needs an API key: set ANTHROPIC_API_KEY in the environment "
            "(the worker's too), or run offline with --provider scripted"
        )
    return None


def repository_problem() -> str | None:
    """Why ANNIHILATION_REPO cannot hold the agents' work, or None (a URL is cloned on use)."""
    value = str(settings.ANNIHILATION_REPO)
    if not value.startswith("/"):
        return None
    repo = Path(value)
    if not repo.exists():
        return (
            f"no repository at ANNIHILATION_REPO={repo}: point ANNIHILATION_REPO at a git "
            "checkout (or a URL), or run `manage.py demo` to make the demo repository there"
        )
    if not (repo / ".git").exists():
        return (
            f"ANNIHILATION_REPO={repo} is not a git repository: run `git init` there and "
            "commit something, or point ANNIHILATION_REPO at a git checkout"
        )
    return None


def wave_problems() -> str | None:
    """What would stop a wave's agents from this process's configuration: the provider that
    ANNIHILATION_PROVIDER forces, and the repository (bursts.hooks.WAVE_CHECKS). Only when the
    waves run this agent runtime (not noop, nor an executor a test installed)."""
    if executor_current() is not agent_run:
        return None
    problem = provider_problem(str(settings.PSYCHONAUTS_PROVIDER or "")) or repository_problem()
    return f"warning: {problem}" if problem else None
