"""Providers behind one interface (`base.Provider`), looked up by name."""

from __future__ import annotations

from collections.abc import Callable

from psychonauts.errors import UnknownProvider
from psychonauts.routing.providers.base import Provider


def _anthropic() -> Provider:
    from psychonauts.routing.providers.anthropic import AnthropicProvider

    return AnthropicProvider()


def _openai() -> Provider:
    from psychonauts.routing.providers.openai import OpenAIProvider

    return OpenAIProvider()


def _scripted() -> Provider:
    from psychonauts.routing.providers.scripted import ScriptedProvider

    return ScriptedProvider()


def _noop() -> Provider:
    from psychonauts.routing.providers.noop import NoopProvider

    return NoopProvider()


def _shell() -> Provider:
    from psychonauts.executors.shell import ShellProvider

    return ShellProvider()


PROVIDERS: dict[str, Callable[[], Provider]] = {
    "anthropic": _anthropic,
    "openai": _openai,
    "scripted": _scripted,
    "noop": _noop,
    "shell": _shell,
}


def provider_get(name: str) -> Provider:
    try:
        factory = PROVIDERS[name]
    except KeyError:
        raise UnknownProvider(
            f"unknown provider {name!r} (known: {', '.join(sorted(PROVIDERS))})"
        ) from None
    return factory()
