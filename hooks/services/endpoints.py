"""Writes to the webhook endpoints (the admin's add, change and delete come here)."""

from __future__ import annotations

from django.db import transaction

from hooks.models import WebhookEndpoint


@transaction.atomic
def endpoint_save(*, endpoint: WebhookEndpoint) -> WebhookEndpoint:
    """Validate and store an endpoint (its fields' validators: URL scheme, secret's variable
    name, known events)."""
    endpoint.full_clean()
    endpoint.save()
    return endpoint


@transaction.atomic
def endpoint_delete(*, endpoint_id: int) -> None:
    """Remove an endpoint and its delivery log."""
    WebhookEndpoint.objects.filter(pk=endpoint_id).delete()
