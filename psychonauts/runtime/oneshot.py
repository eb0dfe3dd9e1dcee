"""One model call for a role, outside any agent run: a prompt in, the answer out (no tools, no
workspace). Reflection's reflector reads finished sessions this way."""

from __future__ import annotations

from django.conf import settings

from psychonauts.errors import RoleNotFound
from psychonauts.models import Role
from psychonauts.roles import roles_sync_defaults
from psychonauts.routing.endpoints import registry_enabled
from psychonauts.routing.providers import provider_get
from psychonauts.routing.providers.base import Provider, ProviderRequest, ProviderResponse, RunInfo
from psychonauts.runtime.execute import Route, registry_route
from quanta.models import Complexity


def role_complete(*, role: str, prompt: str, run: RunInfo) -> ProviderResponse:
    """Ask the role's provider once: the setting's provider (PSYCHONAUTS_PROVIDER) else the
    role's. A model-backed call goes where an agent of the standard tier would: an endpoint of
    the registry when it has one for the role (the role's model, else the standard tier's, in
    its fallback order, skipping endpoints that are down, within their concurrency limits),
    else the role's model, else the standard tier's. Raises RoleNotFound, or ProviderError once
    the provider's retries are spent."""
    found = Role.objects.filter(name=role).first()
    if found is None:
        roles_sync_defaults()  # a shipped role new since the last sync
        found = Role.objects.filter(name=role).first()
    if found is None:
        raise RoleNotFound(f"unknown role {role!r}")
    provider: Provider = provider_get(settings.PSYCHONAUTS_PROVIDER or found.provider)
    model = provider.name
    if provider.uses_llm:
        model = found.model or settings.PSYCHONAUTS_MODELS.get(Complexity.STANDARD, "")
        registry = registry_enabled()
        routed = (
            registry_route(found, registry, model="", complexity=Complexity.STANDARD)
            if registry
            else None
        )
        if isinstance(routed, Route):
            provider, model = routed.provider, routed.model
    request = ProviderRequest(
        model=model,
        system=found.system_prompt,
        messages=[{"role": "user", "content": prompt}],
        tools=[],
        max_tokens=settings.PSYCHONAUTS_MAX_TOKENS,
        run=run,
    )
    return provider.complete(request, lambda _delta: None)
