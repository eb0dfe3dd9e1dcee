from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.urls import reverse

from annihilation.events import publish
from tests.factories import make_chain

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client):
    user = User.objects.create_superuser("admin", "admin@example.com", "pw")
    client.force_login(user)
    return client


def test_every_registered_model_has_working_admin_pages(admin_client):
    a, _b = make_chain(2)
    publish("quanta", "quantum_created", {"quantum_id": a.pk})
    for model in admin.site._registry:
        meta = model._meta
        changelist = reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")
        assert admin_client.get(changelist).status_code == 200, changelist
        assert admin_client.get(changelist, {"q": "step"}).status_code == 200, changelist
        obj = model._default_manager.first()
        if obj is not None:
            change = reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[obj.pk])
            assert admin_client.get(change).status_code == 200, change


def test_events_cannot_be_added_or_edited_in_admin(admin_client):
    event = publish("quanta", "quantum_created", {"quantum_id": 1})
    assert admin_client.get(reverse("admin:annihilation_event_add")).status_code == 403
    response = admin_client.post(
        reverse("admin:annihilation_event_change", args=[event.pk]), {"type": "x"}
    )
    assert response.status_code == 403


def test_healthz_reports_postgres_and_redis(client, redis_client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"postgres": "ok", "redis": "ok"}
