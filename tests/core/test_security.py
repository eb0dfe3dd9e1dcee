"""What a browser gets from the web process: the Content-Security-Policy, and login throttling."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connections
from django.test import AsyncClient, Client

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(db):
    return User.objects.create_user("op", password="correct horse")


def log_in(client: Client, password: str, username: str = "op", path: str = "/login/") -> int:
    return client.post(path, {"username": username, "password": password}).status_code


def test_it_throttles_forty_wrong_passwords_after_the_limit(client, operator, settings):
    statuses = [log_in(client, f"wrong {i}") for i in range(40)]
    limit = settings.AXES_FAILURE_LIMIT
    assert statuses == [200] * (limit - 1) + [429] * (40 - limit + 1)
    response = client.post("/login/", {"username": "op", "password": "correct horse"})
    assert response.status_code == 429  # the right password too, during the lockout
    assert b"Too many failed logins" in response.content
    assert "_auth_user_id" not in client.session

    call_command("axes_reset_username", "op", verbosity=0)
    response = client.post("/login/", {"username": "op", "password": "correct horse"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.get("/").status_code == 200


def test_it_locks_out_one_username_from_one_address_only(client, operator):
    User.objects.create_user("other", password="also correct")
    for i in range(5):
        log_in(client, f"wrong {i}")
    assert log_in(client, "correct horse") == 429
    assert log_in(client, "also correct", username="other") == 302
    elsewhere = Client(REMOTE_ADDR="10.1.2.3")
    assert log_in(elsewhere, "correct horse") == 302


def test_a_login_that_succeeds_clears_the_failures(client, operator):
    for i in range(4):
        assert log_in(client, f"wrong {i}") == 200
    assert log_in(client, "correct horse") == 302
    client.post("/logout/")
    for i in range(4):
        assert log_in(client, f"wrong again {i}") == 200
    assert log_in(client, "correct horse") == 302


def test_it_lifts_the_lockout_after_the_cool_off(client, operator, settings):
    settings.AXES_COOLOFF_TIME = timedelta(seconds=1)
    for i in range(5):
        log_in(client, f"wrong {i}")
    assert log_in(client, "correct horse") == 429
    time.sleep(1.2)
    assert log_in(client, "correct horse") == 302


def test_it_throttles_the_admin_login_too(client):
    User.objects.create_superuser("admin", "admin@example.com", "correct horse")
    statuses = [
        log_in(client, f"wrong {i}", username="admin", path="/admin/login/") for i in range(6)
    ]
    assert statuses == [200] * 4 + [429] * 2
    assert log_in(client, "correct horse", username="admin", path="/admin/login/") == 429


@pytest.mark.django_db(transaction=True)
async def test_the_lockout_page_is_clean_through_the_asgi_handler():
    """daphne runs the middleware chain asynchronously: the lockout is a page there too."""
    await database_sync_to_async(User.objects.create_user)("op", password="correct horse")
    client = AsyncClient()
    try:
        for i in range(5):
            await client.post("/login/", {"username": "op", "password": f"wrong {i}"})
        response = await client.post("/login/", {"username": "op", "password": "correct horse"})
    finally:
        # The test client leaves the views' connection open (in asgiref's sync thread).
        await sync_to_async(connections.close_all)()
    assert response.status_code == 429
    assert b"Too many failed logins" in response.content
    assert "script-src 'self'" in response["Content-Security-Policy"]


def test_it_sends_a_content_security_policy_without_inline_code(client, operator):
    client.force_login(operator)
    policy = client.get("/").headers["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["default-src"] == "'self'"
    assert directives["script-src"] == "'self'" and directives["style-src"] == "'self'"
    assert directives["connect-src"] == "'self' ws://testserver"
    assert directives["frame-ancestors"] == "'none'" and directives["object-src"] == "'none'"
    assert directives["base-uri"] == "'self'" and directives["form-action"] == "'self'"
    assert "unsafe" not in policy
    secure = client.get("/", secure=True).headers["Content-Security-Policy"]
    assert "connect-src 'self' wss://testserver" in secure


def test_it_redirects_plain_http_to_https_except_the_health_probe(settings, redis_client):
    settings.SECURE_SSL_REDIRECT = True  # as with DEBUG off
    client = Client()  # its middleware is built on the first request, with these settings
    response = client.get("/login/")
    assert response.status_code == 301 and response["Location"] == "https://testserver/login/"
    assert client.get("/healthz").status_code == 200
