"""The api app's admin pages: tokens and kept idempotent responses load, read only."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from api.models import IdempotentResponse
from tests.api.conftest import ApiClient

pytestmark = pytest.mark.django_db


def test_its_pages_load_and_nothing_is_edited_there(operator: ApiClient) -> None:
    operator.post("/api/quanta", {"title": "kept"}, **{"Idempotency-Key": "admin-page"})
    kept = IdempotentResponse.objects.get()
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))
    for name in ("apitoken", "idempotentresponse"):
        assert client.get(f"/admin/api/{name}/").status_code == 200, name
        assert client.get(f"/admin/api/{name}/", {"q": "admin"}).status_code == 200, name
    page = client.get(f"/admin/api/idempotentresponse/{kept.pk}/change/")
    assert page.status_code == 200 and b"admin-page" in page.content
    assert client.get("/admin/api/idempotentresponse/add/").status_code == 403
    client.post(f"/admin/api/idempotentresponse/{kept.pk}/delete/", {"post": "yes"})
    assert IdempotentResponse.objects.filter(pk=kept.pk).exists()
    assert client.get("/admin/api/apitoken/add/").status_code == 200
