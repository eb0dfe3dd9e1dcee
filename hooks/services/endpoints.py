"""Writes to the webhook endpoints (the admin's add, change and delete come here)."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from core.destinations import DestinationRefused, destination_check
from hooks.models import WebhookEndpoint


def endpoint_url_problem(url: str) -> str | None:
    """Why deliveries may not go to `url` as written (an internal address or name), or None. The
    name is not resolved here (it may not resolve yet): each delivery resolves and checks it."""
    try:
        destination_check(
            url,
            allow_private=settings.HOOKS_ALLOW_PRIVATE,
            setting="ANNIHILATION_WEBHOOKS_ALLOW_PRIVATE",
            resolve=False,
        )
    except DestinationRefused as exc:
        return str(exc)
    return None


@transaction.atomic
def endpoint_save(*, endpoint: WebhookEndpoint) -> WebhookEndpoint:
    """Validate and store an endpoint (its fields' validators: URL scheme, secret's variable
    name, known events; and its URL's host: never a link-local or metadata address, loopback or
    private only with HOOKS_ALLOW_PRIVATE). Each delivery checks the host again."""
    endpoint.full_clean()
    problem = endpoint_url_problem(endpoint.url)
    if problem is not None:
        raise ValidationError({"url": problem})
    endpoint.save()
    return endpoint


@transaction.atomic
def endpoint_delete(*, endpoint_id: int) -> None:
    """Remove an endpoint and its delivery log."""
    WebhookEndpoint.objects.filter(pk=endpoint_id).delete()
