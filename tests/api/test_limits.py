"""Rate limits: a bucket per token and per action, 429 with Retry-After, refilled over time;
login attempts per address."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from api.services import token_create
from quanta.models import Quantum
from tests.api.conftest import ApiClient, assert_problem

pytestmark = pytest.mark.django_db


def test_it_refuses_reads_past_the_bucket_with_retry_after(
    reader: ApiClient, settings: Any
) -> None:
    settings.API_READS_PER_MIN = 3
    statuses = [reader.get("/api/quanta").status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    response = reader.get("/api/quanta")
    body = assert_problem(response, 429, "rate-limited")
    assert 1 <= int(response["Retry-After"]) <= 20  # a token every 20 s
    assert "GET" in body["detail"]


def test_each_action_and_each_token_has_its_own_bucket(reader: ApiClient, settings: Any) -> None:
    settings.API_READS_PER_MIN = 2
    assert [reader.get("/api/quanta").status_code for _ in range(3)] == [200, 200, 429]
    assert reader.get("/api/waves").status_code == 200  # another action
    assert reader.get("/api/quanta/search", {"q": "x"}).status_code == 200
    other = ApiClient(token_create(name="other", scopes=["read"]).secret)
    assert other.get("/api/quanta").status_code == 200  # another token


def test_a_refused_write_writes_nothing(operator: ApiClient, settings: Any) -> None:
    settings.API_WRITES_PER_MIN = 1
    assert operator.post("/api/quanta", {"title": "one"}).status_code == 201
    assert_problem(operator.post("/api/quanta", {"title": "two"}), 429, "rate-limited")
    assert list(Quantum.objects.values_list("title", flat=True)) == ["one"]
    # Reads have their own, larger bucket.
    assert operator.get("/api/quanta").status_code == 200


def test_the_bucket_refills(reader: ApiClient, settings: Any) -> None:
    settings.API_READS_PER_MIN = 120  # two a second
    for _ in range(120):
        reader.get("/api/me")
    assert reader.get("/api/me").status_code == 429
    time.sleep(0.6)
    assert reader.get("/api/me").status_code == 200


def test_it_limits_login_attempts_per_address(settings: Any) -> None:
    settings.LOGIN_ATTEMPTS_PER_MIN = 3
    settings.AXES_FAILURE_LIMIT = 100  # the lockout is not what is tested here
    User.objects.create_user("op", password="correct horse")
    client = Client()
    statuses = [
        client.post("/login/", {"username": f"user{i}", "password": "guess"}).status_code
        for i in range(4)
    ]
    assert statuses == [200, 200, 200, 429]
    response = client.post("/login/", {"username": "op", "password": "correct horse"})
    assert response.status_code == 429 and int(response["Retry-After"]) >= 1
    assert "_auth_user_id" not in client.session
    assert client.get("/login/").status_code == 200  # the page itself still loads
    # The admin's login shares the address's bucket.
    assert client.post("/admin/login/", {"username": "op", "password": "x"}).status_code == 429
    elsewhere = Client(REMOTE_ADDR="10.9.8.7")
    assert (
        elsewhere.post("/login/", {"username": "op", "password": "correct horse"}).status_code
        == 302
    )


def test_behind_a_trusted_proxy_the_login_limit_and_lockout_key_on_the_forwarded_address(
    settings,
):
    """Every request arrives from the proxy's address; the client's is the entry the proxy
    appended to X-Forwarded-For. What the client wrote further left is not believed."""
    settings.TRUSTED_PROXIES = 1
    settings.LOGIN_ATTEMPTS_PER_MIN = 2
    settings.AXES_FAILURE_LIMIT = 100
    User.objects.create_user("op", password="correct horse")

    def attempt(forwarded: str, password: str = "guess") -> int:
        client = Client(REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR=forwarded)
        return client.post("/login/", {"username": "op", "password": password}).status_code

    # One client rotating a spoofed left-most entry still spends one bucket.
    assert [attempt(f"6.6.6.{i}, 203.0.113.5") for i in range(3)] == [200, 200, 429]
    # Another client behind the same proxy has its own.
    assert attempt("198.51.100.7", password="correct horse") == 302

    settings.TRUSTED_PROXIES = 0  # the header is ignored: everyone is the proxy
    assert [attempt(f"192.0.2.{i}") for i in range(3)] == [200, 200, 429]
