"""What the management commands can do, an operator can do in the control room too."""

from __future__ import annotations

import json

import pytest
import yaml
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from bursts.models import AgentRun
from psychonauts.roles import roles_sync_defaults
from psychonauts.selectors import roles_list
from quanta.models import Dependency, Quantum
from quanta.pipeline_models import Pipeline
from tests.factories import make_chain

pytestmark = pytest.mark.django_db


def test_it_removes_a_dependency_from_the_detail_page(op_client):
    first, second = make_chain(2, prefix="parity")
    page = op_client.get(reverse("quantum", args=[second.pk]))
    assert b"dependency-remove" in page.content
    url = reverse("quantum_dependency_remove", args=[second.pk])
    done = op_client.post(url, {"depends_on": first.pk}, follow=True)
    assert b"no longer waits on" in done.content
    assert not Dependency.objects.filter(quantum=second).exists()
    assert Quantum.objects.get(pk=second.pk).open_blockers == 0
    stale = op_client.post(url, {"depends_on": first.pk}, follow=True)
    assert b"has no blocks dependency" in stale.content
    bad = op_client.post(url, {"depends_on": "nope"}, follow=True)
    assert b"Give the id of the quantum it should stop" in bad.content
    assert Dependency.objects.count() == 0


def test_a_viewer_cannot_remove_a_dependency(viewer_client):
    first, second = make_chain(2, prefix="parity")
    url = reverse("quantum_dependency_remove", args=[second.pk])
    assert viewer_client.post(url, {"depends_on": first.pk}).status_code == 403
    assert Dependency.objects.filter(quantum=second, depends_on=first).exists()
    page = viewer_client.get(reverse("quantum", args=[second.pk]))
    assert b"dependency-remove" not in page.content


GOOD = b"""\
- ref: schema
  title: Design the schema
  labels: [backend]
- title: Build the API
  depends_on: [schema]
"""
BAD = b"""\
- title: ""
- title: fine
  priority: 9
- title: also fine
  prority: 1
"""


def upload(name, content):
    return {"file": SimpleUploadedFile(name, content)}


def test_it_imports_a_file_and_exports_it_in_the_command_format(op_client):
    done = op_client.post(reverse("quanta_import"), upload("plan.yaml", GOOD), follow=True)
    assert b"Imported 2 quanta: created 2" in done.content
    schema = Quantum.objects.get(title="Design the schema")
    api = Quantum.objects.get(title="Build the API")
    assert schema.labels == ["backend"] and api.open_blockers == 1
    page = op_client.get(reverse("quanta"))
    assert b"quanta-import" in page.content and b"quanta-export" in page.content
    exported = op_client.get(reverse("quanta_export"), {"format": "yaml"})
    assert exported.status_code == 200
    assert exported["Content-Disposition"] == 'attachment; filename="quanta.yaml"'
    records = yaml.safe_load(exported.content)
    assert [r["title"] for r in records] == ["Design the schema", "Build the API"]
    assert records[1]["depends_on"] == [f"q{schema.pk}"]
    lines = op_client.get(reverse("quanta_export"), {"format": "jsonl"}).content.splitlines()
    assert [json.loads(line)["title"] for line in lines] == ["Design the schema", "Build the API"]
    # What the download holds imports again (export -> import round-trips).
    again = op_client.post(
        reverse("quanta_import"), upload("quanta.yaml", exported.content), follow=True
    )
    assert b"Imported 2 quanta: created 0, updated 0, unchanged 2" in again.content
    assert Quantum.objects.filter(title="Build the API").count() == 1  # the same quanta
    assert op_client.get(reverse("quanta_export"), {"format": "xml"}).status_code == 400


def test_a_bad_import_lists_every_problem_and_writes_nothing(op_client):
    bad = op_client.post(reverse("quanta_import"), upload("bad.yaml", BAD))
    assert bad.status_code == 400
    errors = bad.context["import_form"].errors["file"]
    assert "bad.yaml:1: title: must not be empty" in errors
    assert "bad.yaml:3: priority: must be 0..4 (0 = critical), got 9" in errors
    assert "bad.yaml:5: prority: unknown field" in errors
    assert b"bad.yaml:5: prority: unknown field" in bad.content
    assert b"nothing written" in bad.content
    broken = op_client.post(reverse("quanta_import"), upload("x.jsonl", b'{"title": "a"}\n{oops'))
    assert broken.status_code == 400
    assert any(
        "x.jsonl:2: not valid JSON" in e for e in broken.context["import_form"].errors["file"]
    )
    empty = op_client.post(reverse("quanta_import"), {})
    assert empty.status_code == 400 and "file" in empty.context["import_form"].errors
    assert not Quantum.objects.exists()


def test_a_viewer_cannot_import_but_may_download(viewer_client):
    assert (
        viewer_client.post(reverse("quanta_import"), upload("plan.yaml", GOOD)).status_code == 403
    )
    assert not Quantum.objects.exists()
    assert b"quanta-import" not in viewer_client.get(reverse("quanta")).content
    assert viewer_client.get(reverse("quanta_export")).status_code == 200


@pytest.fixture
def roles(db):
    roles_sync_defaults()
    return list(roles_list().values_list("name", flat=True))


def queued_tasks(redis_client):
    """(task name, args) of the messages waiting in the broker's default queue."""
    out = []
    for raw in redis_client.lrange("celery", 0, -1):
        headers = json.loads(raw)["headers"]
        out.append((headers["task"], headers["argsrepr"]))
    return out


def test_it_runs_one_agent_from_the_quantum_page(
    op_client, roles, redis_client, django_capture_on_commit_callbacks
):
    quantum = make_chain(1, prefix="agent")[0]
    page = op_client.get(reverse("quantum", args=[quantum.pk]))
    assert b'id="agent-run"' in page.content and f'value="{roles[0]}"'.encode() in page.content
    url = reverse("agent_run_start", args=[quantum.pk])
    with django_capture_on_commit_callbacks(execute=True):
        response = op_client.post(url, {"role": roles[0], "context": "be brief"})
    run = AgentRun.objects.get(quantum=quantum)
    assert response.status_code == 302 and response["Location"] == reverse("focus", args=[run.pk])
    assert run.role == roles[0] and run.context == "be brief" and run.quantum_run_id is None
    assert op_client.get(response["Location"]).status_code == 200
    assert run.agent_id == f"{quantum.pk}_cli_{roles[0]}" and run.attempt == 1
    assert queued_tasks(redis_client) == [("psychonauts.tasks.execute_agent_run", f"({run.pk},)")]


def test_a_bad_role_or_a_viewer_runs_nothing(
    op_client, viewer, roles, redis_client, django_capture_on_commit_callbacks
):
    quantum = make_chain(1, prefix="agent")[0]
    url = reverse("agent_run_start", args=[quantum.pk])
    with django_capture_on_commit_callbacks(execute=True):
        bad = op_client.post(url, {"role": "no-such-role"}, follow=True)
    assert b"role: Select a valid choice" in bad.content
    assert (
        op_client.post(reverse("agent_run_start", args=[99999]), {"role": roles[0]}).status_code
        == 404
    )
    op_client.force_login(viewer)
    assert op_client.post(url, {"role": roles[0]}).status_code == 403
    assert b'id="agent-run"' not in op_client.get(reverse("quantum", args=[quantum.pk])).content
    assert not AgentRun.objects.exists()
    assert queued_tasks(redis_client) == []


DOCS_PIPELINE = """\
name: docs
description: documentation only
match:
  labels: [docs]
stages:
  - name: write
    agents: [coder]
  - name: review
    agents: [reviewer]
"""


def test_it_loads_a_pasted_pipeline_and_a_change_bumps_its_version(op_client, roles):
    assert {"coder", "reviewer"} <= set(roles)
    page = op_client.get(reverse("pipelines"))
    assert b'id="pipeline-load"' in page.content
    done = op_client.post(reverse("pipelines_load"), {"yaml": DOCS_PIPELINE}, follow=True)
    assert b"Loaded docs v1 (created)" in done.content
    docs = Pipeline.objects.get(name="docs")
    assert [s.name for s in docs.stages.order_by("index")] == ["write", "review"]
    assert docs.match_labels == ["docs"] and docs.source == "pasted.yaml (web, op)"
    changed = DOCS_PIPELINE.replace("documentation only", "docs, reviewed")
    again = op_client.post(reverse("pipelines_load"), {"yaml": changed}, follow=True)
    assert b"Loaded docs v2 (updated)" in again.content


def test_a_bad_pipeline_lists_every_problem_and_loads_nothing(op_client, viewer, roles):
    bad = DOCS_PIPELINE.replace("[coder]", "[no-such-role]").replace("name: review", "nme: x")
    response = op_client.post(reverse("pipelines_load"), {"yaml": bad})
    assert response.status_code == 400
    errors = response.context["load_form"].errors["yaml"]
    assert len(errors) >= 2 and all(e.startswith("pasted.yaml:") for e in errors), errors
    assert any("no-such-role" in e for e in errors)
    assert b'id="pipeline-errors"' in response.content
    broken = op_client.post(reverse("pipelines_load"), {"yaml": "name: [unclosed"})
    assert broken.status_code == 400 and broken.context["load_form"].errors["yaml"]
    assert op_client.post(reverse("pipelines_load"), {"yaml": ""}).status_code == 400
    op_client.force_login(viewer)
    assert op_client.post(reverse("pipelines_load"), {"yaml": DOCS_PIPELINE}).status_code == 403
    assert b'id="pipeline-load"' not in op_client.get(reverse("pipelines")).content
    assert not Pipeline.objects.filter(name="docs").exists()
