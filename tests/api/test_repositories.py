"""/api/repositories: list, show, register, change and remove, with problems for bad input;
and waves, goals and quanta started in a repository."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from psychonauts.workspaces.worktrees import demo_repo_ensure
from quanta.models import Quantum
from repos.models import Repository
from tests.api.conftest import ApiClient, assert_problem

pytestmark = pytest.mark.django_db


def test_it_registers_lists_and_removes_a_repository(
    operator: ApiClient, reader: ApiClient, repo: Path, tmp_path: Path
) -> None:
    path = demo_repo_ensure(tmp_path / "second")
    made = operator.post(
        "/api/repositories",
        {
            "name": "second",
            "location": str(path),
            "target_branch": "main",
            "verify_commands": ["python3 -m pytest -q"],
            "environment": "setup: [python3 -m venv .venv]\n",
        },
    )
    assert made.status_code == 201, made.content
    second = made.json()
    assert (second["name"], second["location"], second["is_default"]) == (
        "second",
        str(path),
        False,
    )

    listed = reader.get("/api/repositories").json()
    assert [r["name"] for r in listed] == ["default", "second"]
    assert listed[0]["location"] == str(repo)
    assert reader.get("/api/repositories/second").json()["verify_commands"] == [
        "python3 -m pytest -q"
    ]
    changed = operator.patch("/api/repositories/second", {"verify_commands": ["make test"]})
    assert changed.json()["verify_commands"] == ["make test"]
    assert changed.json()["environment"]  # unchanged

    quantum = operator.post("/api/quanta", {"title": "there", "repository_id": second["id"]})
    assert quantum.json()["repository_id"] == second["id"]
    wave = operator.post("/api/waves", {"labels": ["none"], "repository_id": second["id"]})
    assert wave.status_code == 201 and wave.json()["repository_id"] == second["id"]

    busy = operator.send("DELETE", "/api/repositories/second")
    assert "open quanta" in assert_problem(busy, 409, "conflict")["detail"]
    Quantum.objects.filter(pk=quantum.json()["id"]).update(status="closed")
    assert operator.send("DELETE", "/api/repositories/second").status_code == 200
    assert [r["name"] for r in reader.get("/api/repositories").json()] == ["default"]


def test_bad_input_is_a_problem_and_registers_nothing(
    operator: ApiClient, reader: ApiClient, repo: Path, tmp_path: Path
) -> None:
    path = demo_repo_ensure(tmp_path / "second")
    cases = [
        ({"name": "x", "location": str(tmp_path)}, "is not a git repository"),
        ({"name": "x", "location": str(path), "target_branch": "nope"}, "no branch 'nope'"),
        ({"name": "x", "location": str(path), "environment": "a: [b"}, "environment"),
        ({"name": "Bad Name", "location": str(path)}, "lowercase"),
    ]
    for body, detail in cases:
        body_text = assert_problem(operator.post("/api/repositories", body), 422, "validation")
        assert detail in body_text["detail"], body_text
    assert not Repository.objects.filter(name="x").exists()
    assert (
        operator.post("/api/repositories", {"name": "x", "location": str(path)}).status_code == 201
    )
    dup = operator.post("/api/repositories", {"name": "x", "location": str(path)})
    assert "already registered" in assert_problem(dup, 422, "validation")["detail"]
    assert_problem(reader.get("/api/repositories/ghost"), 404, "not-found")
    assert_problem(operator.send("DELETE", "/api/repositories/default"), 409, "conflict")
    denied = reader.post("/api/repositories", {"name": "y", "location": str(path)})
    assert denied.status_code == 403


def test_the_openapi_schema_describes_repositories(anonymous: ApiClient) -> None:
    schema = json.loads(anonymous.get("/api/openapi.json").content)
    assert {"/api/repositories", "/api/repositories/{name}"} <= set(schema["paths"])
    assert "repository_id" in schema["components"]["schemas"]["WaveStartIn"]["properties"]


def test_waves_and_goals_are_listed_by_repository(
    operator: ApiClient, reader: ApiClient, repo: Path, tmp_path: Path
) -> None:
    path = demo_repo_ensure(tmp_path / "second")
    second = operator.post("/api/repositories", {"name": "second", "location": str(path)}).json()
    there = operator.post("/api/waves", {"labels": ["none"], "repository_id": second["id"]})
    here = operator.post("/api/waves", {"labels": ["none"]})
    goal = operator.post(
        "/api/goals",
        {"title": "g", "success_criteria": "done", "repository_id": second["id"]},
    )
    assert goal.status_code == 201 and goal.json()["repository_id"] == second["id"]

    waves = reader.get("/api/waves", {"repository": "second"}).json()["items"]
    assert [w["id"] for w in waves] == [there.json()["id"]]
    assert {w["id"] for w in reader.get("/api/waves").json()["items"]} == {
        there.json()["id"],
        here.json()["id"],
    }
    goals = reader.get("/api/goals", {"repository": "default"}).json()["items"]
    assert goals == []
    assert_problem(reader.get("/api/waves", {"repository": "ghost"}), 404, "not-found")


def test_quanta_are_listed_and_searched_by_repository(
    operator: ApiClient, reader: ApiClient, anonymous: ApiClient, repo: Path, tmp_path: Path
) -> None:
    path = demo_repo_ensure(tmp_path / "second")
    second = operator.post("/api/repositories", {"name": "second", "location": str(path)}).json()
    there = operator.post(
        "/api/quanta", {"title": "tune the parser", "repository_id": second["id"]}
    )
    here = operator.post("/api/quanta", {"title": "tune the lexer"})
    assert there.status_code == 201 and here.status_code == 201

    listed = reader.get("/api/quanta", {"repository": "second"}).json()["items"]
    assert [q["id"] for q in listed] == [there.json()["id"]]
    listed = reader.get("/api/quanta", {"repository": "default"}).json()["items"]
    assert [q["id"] for q in listed] == [here.json()["id"]]
    assert len(reader.get("/api/quanta").json()["items"]) == 2
    found = reader.get("/api/quanta/search", {"q": "tune", "repository": "second"}).json()
    assert [h["quantum"]["id"] for h in found["items"]] == [there.json()["id"]]
    assert_problem(reader.get("/api/quanta", {"repository": "ghost"}), 404, "not-found")

    # A page's cursor stays bound to the repository it listed.
    for _ in range(2):
        operator.post("/api/quanta", {"title": "more", "repository_id": second["id"]})
    first = reader.get("/api/quanta", {"repository": "second", "limit": 1}).json()
    assert first["next_cursor"]
    assert_problem(
        reader.get("/api/quanta", {"cursor": first["next_cursor"], "limit": 1}), 400, "bad-cursor"
    )

    schema = json.loads(anonymous.get("/api/openapi.json").content)
    names = [p["name"] for p in schema["paths"]["/api/quanta"]["get"]["parameters"]]
    assert "repository" in names
