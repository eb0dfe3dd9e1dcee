"""The pages' forms, random values posted by a logged-in operator: never a 500, and nothing
written when the answer is a 400."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from hypothesis import event, given
from hypothesis import strategies as st

from bursts.models import Wave
from core.access import operator_ensure
from core.models import Event
from quanta.models import Comment, Dependency, Quantum
from quanta.pipeline_models import Pipeline
from tests.factories import make_chain
from tests.fuzz.conftest import FUZZ
from tether.models import Reaching
from tether.services import reaching_quarantine

pytestmark = pytest.mark.django_db

QUANTUM_FIELDS = ["title", "body", "kind", "priority", "complexity", "labels", "pipeline",
                  "acceptance", "parent"]  # fmt: skip
# (url name, takes the quantum's id, field names) of every form an operator posts.
FORMS: list[tuple[str, str, list[str]]] = [
    ("quantum_create", "", [*QUANTUM_FIELDS, "depends_on"]),
    ("quantum_edit", "quantum", QUANTUM_FIELDS),
    ("quantum_comment", "quantum", ["body"]),
    ("quantum_close", "quantum", ["reason"]),
    ("quantum_reopen", "quantum", []),
    ("quantum_defer", "quantum", []),
    ("quantum_dependency_add", "quantum", ["depends_on"]),
    ("quantum_dependency_remove", "quantum", ["depends_on"]),
    ("pipelines_load", "", ["yaml", "replace_default"]),
    ("quanta_import", "", ["file"]),
    ("reaching_answer", "reaching", ["text"]),
    ("wave_start", "", ["labels", "continuous"]),
]
VALUES = ["", " ", "0", "1", "2", "4", "9", "-1", "99999999999999999999", "1e9", "task", "bug",
          "standard", "on", "true", "ui, backend", "../../x", "<script>alert(1)</script>",
          "a\x00b", "\x00", "x" * 600, "é" * 300, "#1", "name: p\nstages: [{name: s, agents: [coder]}]",
          "name: p\ndefault: true\nstages: [{name: s, agents: [coder]}]", "[unclosed"]  # fmt: skip
values = st.one_of(st.sampled_from(VALUES), st.text(max_size=30))
# A file field gets a file: random bytes under a random name.
uploads = st.tuples(
    st.one_of(st.sampled_from(["q.yaml", "q.jsonl", "../x.yaml", "a\x00.yml", "é" * 200]), st.text(max_size=20)),
    st.one_of(st.binary(max_size=200), st.sampled_from([b"- title: a\n", b'{"title": "b"}\n', b"- &a x\n- *a\n"])),
)  # fmt: skip


def snapshot() -> dict[str, Any]:
    return {
        "quanta": list(Quantum.objects.order_by("id").values_list("id", "status", "title", "updated_at")),
        "comments": Comment.objects.count(),
        "dependencies": Dependency.objects.count(),
        "pipelines": list(Pipeline.objects.order_by("name").values_list("name", "version", "is_default")),
        "waves": Wave.objects.count(),
        "reachings": list(Reaching.objects.order_by("id").values_list("id", "status")),
        "events": Event.objects.count(),
    }  # fmt: skip


# A valid quantum form, of which each example changes or leaves out some fields.
VALID_QUANTUM = {"title": "t", "kind": "task", "priority": "2", "complexity": "standard"}


@st.composite
def posts(draw: st.DrawFn) -> tuple[str, str, dict[str, Any]]:
    name, target, fields = draw(st.sampled_from(FORMS))
    data: dict[str, Any] = dict(VALID_QUANTUM) if "title" in fields else {}
    changed = draw(st.lists(st.sampled_from(fields), max_size=3, unique=True)) if fields else []
    for field in changed:
        if draw(st.integers(0, 3)) == 0:
            data.pop(field, None)  # left out
        elif field == "file":
            filename, content = draw(uploads)
            data[field] = SimpleUploadedFile(filename or "x", content)
        else:
            data[field] = draw(values)
    return name, target, data


def login(client: Any) -> None:
    """Once per test (hashing the password is slow): the examples share the client."""
    if "_auth_user_id" not in client.session:
        client.force_login(operator_ensure(username="op", password="pw-operator"))


@FUZZ
@given(post=posts())
def test_forms_answer_anything_without_a_500_or_a_partial_write(client, post) -> None:
    login(client)
    if not Quantum.objects.exists():
        first, _ = make_chain(2)
        reaching_quarantine(quantum_id=first.pk, history="h", failures=3)
    name, target, data = post
    args = {
        "": [],
        "quantum": [Quantum.objects.order_by("id").values_list("id", flat=True).first()],
        "reaching": [Reaching.objects.values_list("id", flat=True).first()],
    }[target]
    before = snapshot()
    response = client.post(reverse(name, args=args), data)
    assert response.status_code in (200, 302, 400), (name, data, response.status_code)
    assert len(response.content) < 2_000_000
    if response.status_code == 400:
        assert snapshot() == before, (name, data)
    event(f"{name}: {response.status_code}")


@FUZZ
@given(
    query=st.dictionaries(
        st.sampled_from(["q", "status", "kind", "priority", "label", "page", "format"]), values
    ),
    quantum_id=st.integers(min_value=0, max_value=2**80),
)
def test_pages_read_any_query_and_any_id_without_a_500(client, query, quantum_id) -> None:
    login(client)
    assert client.get(reverse("quanta"), query).status_code in (200, 400)
    assert client.get(reverse("quanta_export"), query).status_code in (200, 400)
    if quantum_id:
        assert client.get(reverse("quantum", args=[quantum_id])).status_code in (200, 404)
