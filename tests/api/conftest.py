"""An API client per persona: a reader (scope read), an operator (read and operate) and a
revoked token; each request sends its bearer token and JSON."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.test import Client

from api.services import token_create, token_revoke

Response = Any  # the test client's response (an HttpResponse with .json() and .wsgi_request)


class ApiClient:
    def __init__(self, secret: str | None) -> None:
        self.client = Client()
        self.secret = secret

    def _headers(self, extra: dict[str, str]) -> dict[str, str]:
        headers = dict(extra)
        if self.secret is not None:
            headers["Authorization"] = f"Bearer {self.secret}"
        return headers

    def get(self, path: str, params: dict[str, Any] | None = None, **headers: str) -> Response:
        return self.client.get(path, params or {}, headers=self._headers(headers))

    def send(
        self, method: str, path: str, body: Any = None, *, raw: bytes | None = None, **headers: str
    ) -> Response:
        data = raw if raw is not None else json.dumps(body if body is not None else {})
        return self.client.generic(
            method, path, data, content_type="application/json", headers=self._headers(headers)
        )

    def post(self, path: str, body: Any = None, **headers: str) -> Response:
        return self.send("POST", path, body, raw=None, **headers)

    def patch(self, path: str, body: Any = None, **headers: str) -> Response:
        return self.send("PATCH", path, body, raw=None, **headers)


@pytest.fixture(autouse=True)
def fresh_buckets(redis_client: redis.Redis) -> Iterator[None]:
    """Every test starts with full rate-limit buckets (the fixture empties the Redis db)."""
    yield


@pytest.fixture
def reader(db: None) -> ApiClient:
    return ApiClient(token_create(name="dashboard", scopes=["read"]).secret)


@pytest.fixture
def operator(db: None) -> ApiClient:
    return ApiClient(token_create(name="ci", scopes=["read", "operate"]).secret)


@pytest.fixture
def revoked(db: None) -> ApiClient:
    made = token_create(name="old laptop", scopes=["read", "operate"])
    token_revoke(token_id=made.token.pk)
    return ApiClient(made.secret)


@pytest.fixture
def anonymous(db: None) -> ApiClient:
    return ApiClient(None)


def assert_problem(response: Response, status: int, kind: str) -> dict[str, Any]:
    """The response is an RFC 9457 problem of `kind` with `status`; returns its body."""
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body: dict[str, Any] = json.loads(response.content)
    assert body["type"] == f"urn:annihilation:problem:{kind}"
    assert body["status"] == status
    assert body["title"] and body["detail"]
    assert body["instance"] == response.wsgi_request.path
    return body
