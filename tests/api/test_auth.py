"""Tokens: bearer auth, scopes, revocation, hashing at rest, and the management command."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from api.models import ApiToken
from api.services import sha256_hex, token_create
from tests.api.conftest import ApiClient, assert_problem
from tests.factories import make_quantum

pytestmark = pytest.mark.django_db


def test_it_refuses_a_request_without_a_token(anonymous: ApiClient) -> None:
    response = anonymous.get("/api/quanta")
    assert_problem(response, 401, "unauthenticated")
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "secret", ["nonsense", "ann_", "ann_0123456789ab_wrong", "Basic abc"], ids=repr
)
def test_it_refuses_an_unknown_or_malformed_token(secret: str, operator: ApiClient) -> None:
    assert_problem(ApiClient(secret).get("/api/quanta"), 401, "unauthenticated")


def test_it_refuses_a_token_whose_secret_is_wrong_for_its_prefix(operator: ApiClient) -> None:
    assert operator.secret is not None
    tampered = operator.secret[:-4] + ("AAAA" if not operator.secret.endswith("AAAA") else "BBBB")
    assert_problem(ApiClient(tampered).get("/api/quanta"), 401, "unauthenticated")


def test_a_revoked_token_is_refused(revoked: ApiClient) -> None:
    assert_problem(revoked.get("/api/quanta"), 401, "unauthenticated")


def test_a_read_token_reads_but_cannot_operate(reader: ApiClient) -> None:
    quantum = make_quantum("Ship it")
    assert reader.get(f"/api/quanta/{quantum.pk}").status_code == 200
    body = assert_problem(reader.post("/api/quanta", {"title": "Nope"}), 403, "forbidden")
    assert "operate" in body["detail"]
    assert_problem(
        reader.post(f"/api/quanta/{quantum.pk}/close", {"reason": "x"}), 403, "forbidden"
    )
    quantum.refresh_from_db()
    assert quantum.status == "open"


def test_an_operate_only_token_cannot_read() -> None:
    client = ApiClient(token_create(name="writer", scopes=["operate"]).secret)
    assert_problem(client.get("/api/quanta"), 403, "forbidden")
    assert client.post("/api/quanta", {"title": "Written"}).status_code == 201


def test_the_token_is_stored_hashed_and_last_use_is_recorded(operator: ApiClient) -> None:
    assert operator.secret is not None
    token = ApiToken.objects.get()
    assert operator.secret not in json.dumps(
        list(ApiToken.objects.values_list("prefix", "secret_sha256", "name"))
    )
    assert token.secret_sha256 == sha256_hex(operator.secret)
    assert token.last_used_at is None
    me = operator.get("/api/me").json()
    assert me["name"] == "ci" and me["scopes"] == ["operate", "read"]
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_the_command_creates_lists_and_revokes_tokens() -> None:
    out = StringIO()
    call_command("tokens", "create", "nightly build", "--scope", "operate", "--json", stdout=out)
    created = json.loads(out.getvalue())
    assert created["scopes"] == ["operate"] and created["token"].startswith("ann_")
    client = ApiClient(created["token"])
    assert client.post("/api/quanta", {"title": "From the command"}).status_code == 201

    out = StringIO()
    call_command("tokens", "list", "--json", stdout=out)
    listed = json.loads(out.getvalue())
    assert [t["name"] for t in listed] == ["nightly build"]
    assert "token" not in listed[0] and created["token"] not in out.getvalue()

    call_command("tokens", "revoke", str(created["id"]), "--json", stdout=StringIO())
    assert_problem(client.post("/api/quanta", {"title": "After"}), 401, "unauthenticated")
    out = StringIO()
    call_command("tokens", "list", "--json", stdout=out)
    assert json.loads(out.getvalue()) == []
    out = StringIO()
    call_command("tokens", "list", "--all", "--json", stdout=out)
    assert json.loads(out.getvalue())[0]["revoked_at"] is not None


def test_the_command_refuses_to_revoke_twice_or_an_unknown_token() -> None:
    made = token_create(name="x", scopes=["read"])
    call_command("tokens", "revoke", str(made.token.pk), stdout=StringIO())
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="already revoked"):
        call_command("tokens", "revoke", str(made.token.pk), stdout=StringIO())
    with pytest.raises(CommandError, match="no API token"):
        call_command("tokens", "revoke", "999999", stdout=StringIO())


def test_the_command_refuses_an_empty_name() -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="name"):
        call_command("tokens", "create", "  ", stdout=StringIO())
    assert not ApiToken.objects.exists()


def test_the_admin_creates_a_token_shown_once_and_revokes_it() -> None:
    admin = User.objects.create_superuser("admin", "a@example.com", "pw")
    client = Client()
    client.force_login(admin)
    response = client.post("/admin/api/apitoken/add/", {"name": "grafana", "scopes": ["read"]})
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    token = ApiToken.objects.get()
    page = response.content.decode()
    start = page.index('<code id="api-token">') + len('<code id="api-token">')
    secret = page[start : page.index("</code>", start)]
    assert secret.startswith(f"ann_{token.prefix}_")
    assert ApiClient(secret).get("/api/me").json()["name"] == "grafana"
    # Never again: the list and the detail show the prefix only.
    listing = client.get("/admin/api/apitoken/").content.decode()
    detail = client.get(f"/admin/api/apitoken/{token.pk}/change/").content.decode()
    assert secret not in listing and secret not in detail
    client.post(
        "/admin/api/apitoken/",
        {"action": "revoke", "_selected_action": [token.pk]},
    )
    token.refresh_from_db()
    assert token.revoked_at is not None and token.revoked_by == "admin"
    assert_problem(ApiClient(secret).get("/api/me"), 401, "unauthenticated")
