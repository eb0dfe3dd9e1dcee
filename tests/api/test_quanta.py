"""Quanta over HTTP: list with filters and cursors, search, show, create with idempotency keys,
update, close, import; every refusal a problem and nothing written."""

from __future__ import annotations

import json
from typing import Any

import pytest

from api.models import IdempotentResponse
from core.metrics import VALIDATION_FAILURES
from quanta import search as quanta_search_module
from quanta.models import Dependency, Quantum
from tests.api.conftest import ApiClient, assert_problem
from tests.factories import make_quantum

pytestmark = pytest.mark.django_db


def failures() -> float:
    return float(VALIDATION_FAILURES.labels(entry="api")._value.get())


def all_pages(client: ApiClient, path: str, **params: Any) -> list[list[int]]:
    pages: list[list[int]] = []
    cursor = None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        body = client.get(path, query).json()
        pages.append([item.get("quantum", item)["id"] for item in body["items"]])
        cursor = body["next_cursor"]
        if cursor is None:
            return pages


def test_it_lists_quanta_in_priority_order_with_filters(reader: ApiClient) -> None:
    low = make_quantum("Polish", priority=3, labels=["ui"])
    high = make_quantum("Fix the crash", priority=0, kind="bug", labels=["core"])
    closed = make_quantum("Old", priority=1, labels=["ui"])
    Quantum.objects.filter(pk=closed.pk).update(status="closed")
    body = reader.get("/api/quanta").json()
    assert [q["id"] for q in body["items"]] == [high.pk, closed.pk, low.pk]
    assert body["next_cursor"] is None
    assert body["items"][0]["kind"] == "bug" and body["items"][0]["labels"] == ["core"]
    ids = lambda **f: [q["id"] for q in reader.get("/api/quanta", f).json()["items"]]  # noqa: E731
    assert ids(label="ui") == [closed.pk, low.pk]
    assert ids(status="open", label="ui") == [low.pk]
    assert ids(kind="bug") == [high.pk]
    assert ids(priority=3) == [low.pk]


def test_cursors_walk_every_quantum_once_in_a_stable_order(reader: ApiClient) -> None:
    made = [make_quantum(f"q{i}", priority=i % 3) for i in range(23)]
    pages = all_pages(reader, "/api/quanta", limit=5)
    assert [len(p) for p in pages] == [5, 5, 5, 5, 3]
    seen = [i for page in pages for i in page]
    expected = [q.pk for q in sorted(made, key=lambda q: (q.priority, q.created_at, q.pk))]
    assert seen == expected
    # A quantum of the first page removed meanwhile does not shift the next page (as an
    # offset would, skipping one).
    first = reader.get("/api/quanta", {"limit": 5}).json()
    Quantum.objects.filter(pk=expected[0]).delete()
    second = reader.get("/api/quanta", {"limit": 5, "cursor": first["next_cursor"]}).json()
    assert [q["id"] for q in second["items"]] == expected[5:10]


def test_it_refuses_a_cursor_it_did_not_hand_out_or_from_other_filters(reader: ApiClient) -> None:
    for i in range(3):
        make_quantum(f"q{i}", labels=["a"])
    cursor = reader.get("/api/quanta", {"limit": 1, "label": "a"}).json()["next_cursor"]
    assert_problem(reader.get("/api/quanta", {"cursor": "garbage"}), 400, "bad-cursor")
    assert_problem(reader.get("/api/quanta", {"cursor": cursor[:-2] + "xx"}), 400, "bad-cursor")
    body = assert_problem(
        reader.get("/api/quanta", {"cursor": cursor, "label": "b"}), 400, "bad-cursor"
    )
    assert "another listing" in body["detail"]
    assert_problem(reader.get("/api/waves", {"cursor": cursor}), 400, "bad-cursor")


def test_it_refuses_a_page_size_out_of_range(reader: ApiClient, settings: Any) -> None:
    body = assert_problem(reader.get("/api/quanta", {"limit": 0}), 422, "validation")
    assert body["errors"][0]["field"] == "query.limit"
    body = assert_problem(
        reader.get("/api/quanta", {"limit": settings.API_PAGE_MAX + 1}), 422, "validation"
    )
    assert_problem(reader.get("/api/quanta", {"limit": "ten"}), 422, "validation")


def test_it_searches_best_match_first_and_pages_the_hits(reader: ApiClient) -> None:
    best = make_quantum("Login page crashes", body="the login page", priority=3)
    other = make_quantum("Session store", body="login sessions expire", priority=1)
    make_quantum("Unrelated")
    ranked = {"q": "login", "order": "rank"}
    body = reader.get("/api/quanta/search", ranked).json()
    assert [h["quantum"]["id"] for h in body["items"]] == [best.pk, other.pk]
    assert body["items"][0]["rank"] > body["items"][1]["rank"]
    first = reader.get("/api/quanta/search", {**ranked, "limit": 1}).json()
    second = reader.get(
        "/api/quanta/search", {**ranked, "limit": 1, "cursor": first["next_cursor"]}
    ).json()
    assert [h["quantum"]["id"] for h in first["items"] + second["items"]] == [best.pk, other.pk]
    assert second["next_cursor"] is None
    # By default in the list's order (priority first), paged by keyset.
    body = reader.get("/api/quanta/search", {"q": "login"}).json()
    assert [h["quantum"]["id"] for h in body["items"]] == [other.pk, best.pk]
    assert all(h["rank"] > 0 for h in body["items"])
    assert all_pages(reader, "/api/quanta/search", q="login", limit=1) == [[other.pk], [best.pk]]
    assert (
        reader.get("/api/quanta/search", {"q": '"session store"'}).json()["items"][0]["quantum"][
            "id"
        ]
        == other.pk
    )


@pytest.mark.parametrize("window", [1, 2, 20])
@pytest.mark.parametrize(
    ("q", "label"), [("deploy", "ops"), ("rollback", None), ("rollback", "ops")]
)
def test_search_pages_with_a_filter_have_no_duplicates_or_gaps(
    reader: ApiClient, monkeypatch: Any, window: int, q: str, label: str | None
) -> None:
    # Rows per page asked for that the search reads of the listing before it turns to the
    # full-text index: 1 and 2 send the rare queries there, 20 answers them from the walk.
    monkeypatch.setattr(quanta_search_module, "IN_ORDER_WINDOW_PER_ROW", window)
    made = [
        make_quantum(
            f"deploy step {i}",
            body="rollback plan" if i % 6 == 3 else "plain",
            priority=(i * 7) % 5,
            labels=["ops" if i % 3 == 0 else "dev"],
        )
        for i in range(24)
    ]
    expected = [
        quantum.pk
        for quantum in sorted(made, key=lambda m: (m.priority, m.created_at, m.pk))
        if q in f"{quantum.title} {quantum.body}" and (label is None or label in quantum.labels)
    ]
    assert expected  # every case finds something
    params = {"q": q, "limit": 2, **({"label": label} if label else {})}
    pages = all_pages(reader, "/api/quanta/search", **params)
    assert [pk for page in pages for pk in page] == expected
    assert all(len(page) == 2 for page in pages[:-1])


def test_it_refuses_a_search_it_cannot_parse(reader: ApiClient) -> None:
    assert_problem(reader.get("/api/quanta/search", {"q": "OR -"}), 422, "validation")
    body = assert_problem(reader.get("/api/quanta/search"), 422, "validation")
    assert body["errors"][0]["field"] == "query.q"


def test_it_shows_a_quantum_or_says_there_is_none(reader: ApiClient) -> None:
    quantum = make_quantum("Shown", acceptance="it works")
    body = reader.get(f"/api/quanta/{quantum.pk}").json()
    assert (body["id"], body["title"], body["acceptance"]) == (quantum.pk, "Shown", "it works")
    problem = assert_problem(reader.get("/api/quanta/999999"), 404, "not-found")
    assert "#999999" in problem["detail"]
    assert_problem(reader.get("/api/nothing/here"), 404, "not-found")
    assert_problem(ApiClient(None).get("/api/"), 404, "not-found")


def test_it_creates_a_quantum_with_its_dependencies(operator: ApiClient) -> None:
    blocker = make_quantum("First")
    response = operator.post(
        "/api/quanta",
        {"title": "Second", "priority": 1, "labels": ["api"], "depends_on": [blocker.pk]},
    )
    assert response.status_code == 201
    created = response.json()
    assert (created["title"], created["priority"], created["labels"]) == ("Second", 1, ["api"])
    assert Dependency.objects.filter(quantum_id=created["id"], depends_on=blocker).exists()


def test_the_same_idempotency_key_and_body_return_the_first_response(operator: ApiClient) -> None:
    body = {"title": "Exactly once"}
    first = operator.post("/api/quanta", body, **{"Idempotency-Key": "k-1"})
    again = operator.post("/api/quanta", body, **{"Idempotency-Key": "k-1"})
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first
    assert Quantum.objects.filter(title="Exactly once").count() == 1
    # Another key is another request.
    operator.post("/api/quanta", body, **{"Idempotency-Key": "k-2"})
    assert Quantum.objects.filter(title="Exactly once").count() == 2


def test_the_same_key_with_another_body_is_refused_and_creates_nothing(
    operator: ApiClient,
) -> None:
    operator.post("/api/quanta", {"title": "One"}, **{"Idempotency-Key": "k"})
    response = operator.post("/api/quanta", {"title": "Two"}, **{"Idempotency-Key": "k"})
    assert_problem(response, 422, "idempotency-conflict")
    assert not Quantum.objects.filter(title="Two").exists()
    # The same key on another operation is another request too.
    response = operator.post("/api/goals", {"title": "G", "success_criteria": "c"},
                             **{"Idempotency-Key": "k"})  # fmt: skip
    assert_problem(response, 422, "idempotency-conflict")


def test_a_refused_create_keeps_nothing_so_the_key_can_be_sent_again(operator: ApiClient) -> None:
    refused = operator.post("/api/quanta", {"title": "x", "priority": 9},
                            **{"Idempotency-Key": "retry"})  # fmt: skip
    assert_problem(refused, 422, "validation")
    assert not IdempotentResponse.objects.exists() and not Quantum.objects.exists()
    fixed = operator.post("/api/quanta", {"title": "x", "priority": 9},
                          **{"Idempotency-Key": "retry"})  # fmt: skip
    assert fixed.status_code == 422  # the same request still fails: it was not stored


def test_the_idempotency_key_itself_is_checked(operator: ApiClient) -> None:
    body = assert_problem(
        operator.post("/api/quanta", {"title": "x"}, **{"Idempotency-Key": "k" * 256}),
        422,
        "validation",
    )
    assert body["errors"][0]["field"] == "header.Idempotency-Key"
    assert not Quantum.objects.exists()


def test_keys_belong_to_their_token(operator: ApiClient) -> None:
    from api.services import token_create

    other = ApiClient(token_create(name="other", scopes=["read", "operate"]).secret)
    operator.post("/api/quanta", {"title": "Mine"}, **{"Idempotency-Key": "shared"})
    response = other.post("/api/quanta", {"title": "Theirs"}, **{"Idempotency-Key": "shared"})
    assert response.status_code == 201 and response.json()["title"] == "Theirs"


def test_it_updates_fields_and_refuses_a_bad_value(operator: ApiClient) -> None:
    quantum = make_quantum("Before", priority=2)
    body = operator.patch(f"/api/quanta/{quantum.pk}", {"title": "After", "labels": ["x"]}).json()
    assert (body["title"], body["labels"], body["priority"]) == ("After", ["x"], 2)
    problem = assert_problem(
        operator.patch(f"/api/quanta/{quantum.pk}", {"title": "Again", "priority": 7}),
        422,
        "validation",
    )
    assert problem["errors"][0]["field"] == "body.priority"
    quantum.refresh_from_db()
    assert (quantum.title, quantum.priority) == ("After", 2)
    assert_problem(operator.patch(f"/api/quanta/{quantum.pk}", {}), 422, "validation")
    assert_problem(operator.patch("/api/quanta/999999", {"title": "x"}), 404, "not-found")


def test_it_closes_a_quantum_once(operator: ApiClient) -> None:
    quantum = make_quantum("Done soon")
    body = operator.post(f"/api/quanta/{quantum.pk}/close", {"reason": "shipped"}).json()
    assert (body["status"], body["close_reason"]) == ("closed", "shipped")
    again = operator.post(f"/api/quanta/{quantum.pk}/close", {"reason": "twice"})
    assert "it is closed" in assert_problem(again, 409, "conflict")["detail"]
    other = make_quantum("Open")
    assert_problem(operator.post(f"/api/quanta/{other.pk}/close", {"reason": " "}),
                   422, "validation")  # fmt: skip
    other.refresh_from_db()
    assert other.status == "open"


def test_it_imports_all_or_nothing(operator: ApiClient) -> None:
    text = "- ref: a\n  title: Design\n- title: Build\n  depends_on: [a]\n"
    response = operator.post("/api/quanta/import", {"format": "yaml", "text": text})
    assert response.status_code == 201
    ids = response.json()["ids"]
    assert [Quantum.objects.get(pk=i).title for i in ids] == ["Design", "Build"]
    bad = "- title: Fine\n- body: no title\n  priority: 12\n"
    problem = assert_problem(
        operator.post("/api/quanta/import", {"format": "yaml", "text": bad}), 422, "validation"
    )
    assert any("import.yaml:2" in e["message"] and "title" in e["message"]
               for e in problem["errors"])  # fmt: skip
    assert Quantum.objects.count() == 2
    jsonl = '{"title": "From JSON"}\n'
    response = operator.post("/api/quanta/import", {"format": "jsonl", "text": jsonl})
    assert response.status_code == 201


@pytest.mark.parametrize(
    ("raw", "kind", "field"),
    [
        (b'{"title": ', "malformed", None),
        (b"not json at all", "malformed", None),
        (b'["a list"]', "validation", None),
        (b'{"body": "no title"}', "validation", "body.payload.title"),
        (b'{"title": "x", "colour": "red"}', "validation", "body.payload.colour"),
        (b'{"title": 12}', "validation", "body.payload.title"),
        (b'{"title": "x", "labels": "not a list"}', "validation", "body.payload.labels"),
        (b'{"title": ""}', "validation", "body.title"),
        (b'{"title": "a\\u0000b"}', "validation", None),
        (b'{"title": "x", "kind": "saga"}', "validation", "body.kind"),
        (b'{"title": "x", "depends_on": [999999]}', "not-found", None),
    ],
    ids=lambda v: v.decode()[:30] if isinstance(v, bytes) else str(v),
)
def test_each_kind_of_bad_input_is_a_problem_and_writes_nothing(
    operator: ApiClient, raw: bytes, kind: str, field: str | None
) -> None:
    before = failures()
    status = {"malformed": 400, "validation": 422, "not-found": 404}[kind]
    body = assert_problem(operator.send("POST", "/api/quanta", raw=raw), status, kind)
    if field is not None:
        assert field in [e["field"] for e in body["errors"]], body
    assert not Quantum.objects.exists()
    if status in (400, 422):
        assert failures() == before + 1


def test_a_wrong_method_is_a_problem(operator: ApiClient) -> None:
    response = operator.send("DELETE", "/api/quanta")
    body = assert_problem(response, 405, "method-not-allowed")
    assert "GET" in response["Allow"] and "DELETE" in body["detail"]


def test_the_openapi_schema_describes_the_api(anonymous: ApiClient) -> None:
    schema = json.loads(anonymous.get("/api/openapi.json").content)
    assert schema["info"]["title"] == "Annihilation API"
    paths = schema["paths"]
    for path in ("/api/quanta", "/api/quanta/search", "/api/quanta/{quantum_id}/close",
                 "/api/quanta/import", "/api/goals", "/api/waves/{wave_id}/cancel",
                 "/api/questions/{reaching_id}/answer", "/api/drifts/{drift_id}/reject",
                 "/api/changes/{change_id}/approve"):  # fmt: skip
        assert path in paths, path
    schemes = schema["components"]["securitySchemes"].values()
    assert any(s["type"] == "http" and s["scheme"] == "bearer" for s in schemes)
    # The docs page runs under the Content-Security-Policy: its scripts are our static files.
    docs = anonymous.get("/api/docs")
    page = docs.content.decode()
    assert docs.status_code == 200 and "<script>" not in page and "https://" not in page
    for asset in ("/static/ninja/swagger-ui-bundle.js", "/static/ninja/swagger-ui-init.js"):
        assert asset in page
        served = anonymous.client.get(asset)
        served.close()  # a file response: its file is closed with it
        assert served.status_code == 200


def test_a_key_past_its_retention_is_forgotten(operator: ApiClient, settings: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from api.tasks import purge_idempotency_keys

    operator.post("/api/quanta", {"title": "Old"}, **{"Idempotency-Key": "old"})
    operator.post("/api/quanta", {"title": "New"}, **{"Idempotency-Key": "new"})
    aged = timezone.now() - timedelta(hours=settings.API_IDEMPOTENCY_RETENTION_H, minutes=1)
    IdempotentResponse.objects.filter(key="old").update(created_at=aged)
    assert purge_idempotency_keys() == 1
    assert list(IdempotentResponse.objects.values_list("key", flat=True)) == ["new"]
    again = operator.post("/api/quanta", {"title": "Old"}, **{"Idempotency-Key": "old"})
    assert again.status_code == 201 and "Idempotent-Replayed" not in again
    assert Quantum.objects.filter(title="Old").count() == 2


def test_a_body_over_the_limit_is_refused_before_it_is_read(
    operator: ApiClient, settings: Any
) -> None:
    settings.API_BODY_MAX_BYTES = 1024
    body = assert_problem(
        operator.post("/api/quanta", {"title": "x", "body": "y" * 2000}), 413, "too-large"
    )
    assert "1,024" in body["detail"]
    assert not Quantum.objects.exists()
    assert operator.post("/api/quanta", {"title": "small"}).status_code == 201
