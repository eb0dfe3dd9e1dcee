"""Webhook endpoints are made in the admin; the delivery logs are there to read."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from hooks.models import WebhookEndpoint

pytestmark = pytest.mark.django_db

ADD = "/admin/hooks/webhookendpoint/add/"


@pytest.fixture
def admin_client(client):
    User.objects.create_superuser("root", password="pw-for-admin-tests")
    client.force_login(User.objects.get(username="root"))
    return client


def test_it_creates_an_endpoint_with_its_chosen_events(admin_client):
    assert admin_client.get(ADD).status_code == 200
    response = admin_client.post(ADD, {
        "name": "ops", "url": "https://hooks.example.com/in", "secret_env": "OPS_HOOK_SECRET",
        "events": ["wave.completed", "alert.fired"], "active": "on",
    })  # fmt: skip
    assert response.status_code == 302, response.content
    endpoint = WebhookEndpoint.objects.get()
    assert sorted(endpoint.events) == ["alert.fired", "wave.completed"]
    assert endpoint.secret_env == "OPS_HOOK_SECRET"


def test_it_refuses_a_secret_value_where_a_variable_name_belongs(admin_client):
    response = admin_client.post(ADD, {
        "name": "ops", "url": "https://hooks.example.com/in", "secret_env": "s3cr3t value!",
        "events": ["wave.completed"], "active": "on",
    })  # fmt: skip
    assert response.status_code == 200
    assert b"environment variable" in response.content
    assert not WebhookEndpoint.objects.exists()


def test_the_logs_are_listed_and_read_only(admin_client):
    for path in ("webhookdelivery", "githubdelivery", "githublink"):
        assert admin_client.get(f"/admin/hooks/{path}/").status_code == 200
        assert admin_client.get(f"/admin/hooks/{path}/add/").status_code == 403
