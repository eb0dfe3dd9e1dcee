"""Hostile input on the pages: a 400 with the error next to the field, never a 500, a huge
response or a partial write."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from bursts.models import Wave
from quanta.models import Comment, Quantum
from quanta.pipeline_models import Pipeline
from quanta.pipelines.services import pipelines_load, shipped_pipelines_dir
from tests.factories import make_quantum

pytestmark = pytest.mark.django_db

BOMB = "\n".join(
    ['- &a {title: "lol", body: "lol"}']
    + [
        f"- &{n} [" + ",".join([f"*{p}"] * 9) + "]"
        for p, n in zip("abcdefghi", "bcdefghij", strict=True)
    ]
).encode()


def upload(name: str, content: bytes) -> dict[str, SimpleUploadedFile]:
    return {"file": SimpleUploadedFile(name, content)}


def test_an_import_over_the_limit_is_a_form_error_not_a_413(op_client):
    response = op_client.post(reverse("quanta_import"), upload("big.yaml", b"#" * (6 * 2**20)))
    assert response.status_code == 400
    assert response.context["import_form"].errors["file"] == [
        "6.0 MiB is over the import limit of 5.0 MiB (ANNIHILATION_IMPORT_MAX_BYTES)"
    ]
    assert len(response.content) < 100_000
    assert Quantum.objects.count() == 0


def test_a_yaml_bomb_upload_is_refused_in_a_short_page(op_client):
    response = op_client.post(reverse("quanta_import"), upload("bomb.yaml", BOMB))
    assert response.status_code == 400
    assert response.context["import_form"].errors["file"] == [
        "bomb.yaml:5: aliases would expand the document by more than 10,000 nodes"
    ]
    assert len(response.content) < 100_000


def test_an_upload_with_a_hostile_name_or_bytes_is_a_form_error(op_client):
    named = op_client.post(
        reverse("quanta_import"), upload("../../" + "é" * 300 + "\x00.jsonl", b'{"title": 1}\n')
    )
    assert named.status_code == 400
    [problem] = named.context["import_form"].errors["file"]
    assert problem.endswith(".jsonl:1: title: must not be empty") and len(problem) < 200
    nul = op_client.post(reverse("quanta_import"), upload("nul.yaml", b"- title: a\x00\n"))
    assert nul.context["import_form"].errors["file"] == ["nul.yaml:1: contains a NUL byte"]
    many = b"".join(b"- {title: x, colour: red}\n" for _ in range(500))
    response = op_client.post(reverse("quanta_import"), upload("many.yaml", many))
    errors = response.context["import_form"].errors["file"]
    assert len(errors) == 51 and errors[-1] == "… and 450 more"
    assert Quantum.objects.count() == 0


def test_a_pasted_pipeline_over_the_limit_is_a_form_error(op_client, settings):
    settings.IMPORT_MAX_BYTES = 1024
    response = op_client.post(reverse("pipelines_load"), {"yaml": "# " + "x" * 2000})
    assert response.status_code == 400
    assert "over the import limit" in response.context["load_form"].errors["yaml"][0]


def test_replacing_the_default_pipeline_on_the_page_needs_a_confirmation(op_client):
    pipelines_load(paths=[shipped_pipelines_dir()])
    quick = "name: quick\ndefault: true\nstages: [{name: only, agents: [coder]}]\n"
    refused = op_client.post(reverse("pipelines_load"), {"yaml": quick})
    assert refused.status_code == 400
    assert refused.context["load_form"].errors["replace_default"] == [
        "'quick' would replace 'default' as the default pipeline: tick this to confirm, and "
        "load again. Nothing was loaded."
    ]
    assert b'id="pipeline-default-errors"' in refused.content
    assert not Pipeline.objects.filter(name="quick").exists()
    assert Pipeline.objects.get(is_default=True).name == "default"
    done = op_client.post(
        reverse("pipelines_load"), {"yaml": quick, "replace_default": "on"}, follow=True
    )
    assert b"Loaded quick v1 (created)" in done.content
    assert Pipeline.objects.get(is_default=True).name == "quick"


def test_nul_characters_and_out_of_range_ids_are_field_errors(op_client):
    quantum = make_quantum("target")
    create = op_client.post(reverse("quantum_create"), {"title": "a\x00b", "kind": "task",
                            "priority": 2, "complexity": "standard", "parent": "9" * 25})  # fmt: skip
    assert create.status_code == 400
    assert set(create.context["form"].errors) == {"title", "parent"}
    deps = op_client.post(
        reverse("quantum_create"),
        {"title": "t", "kind": "task", "priority": 2, "complexity": "standard",
         "depends_on": "99999999999999999999"},
    )  # fmt: skip
    assert deps.status_code == 400 and "depends_on" in deps.context["form"].errors
    comment = op_client.post(reverse("quantum_comment", args=[quantum.pk]), {"body": "a\x00"})
    assert comment.status_code == 302 and not Comment.objects.exists()
    assert op_client.get(reverse("quantum", args=[10**20])).status_code == 404
    assert (
        op_client.post(reverse("quantum_close", args=[10**20]), {"reason": "x"}).status_code == 404
    )
    assert Quantum.objects.count() == 1


def test_wave_labels_on_the_dashboard_are_checked_like_quanta_labels(op_client):
    for labels in ["../../x", "<script>", "x" * 65]:
        response = op_client.post(reverse("wave_start"), {"labels": labels})
        assert response.status_code == 400
        assert "is not a label" in str(response.context["start_form"].errors["labels"])
    assert not Wave.objects.exists()


def test_cancelling_a_wave_never_redirects_to_another_site(op_client):
    wave = Wave.objects.create()
    response = op_client.post(
        reverse("wave_cancel", args=[wave.pk]), {"next": "https://evil.example/x"}
    )
    assert response.status_code == 302 and response["Location"] == reverse("dashboard")
    wave = Wave.objects.create()
    back = op_client.post(reverse("wave_cancel", args=[wave.pk]), {"next": "/waves/"})
    assert back["Location"] == "/waves/"


def test_a_post_far_over_the_limit_is_djangos_plain_400(op_client, settings):
    body = "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)
    response = op_client.post(reverse("pipelines_load"), {"yaml": body})
    assert response.status_code == 400 and len(response.content) < 10_000
    assert not Pipeline.objects.exists()
