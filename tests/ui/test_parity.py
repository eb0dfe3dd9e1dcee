"""What the management commands can do, an operator can do in the control room too."""

from __future__ import annotations

import pytest
from django.urls import reverse

from quanta.models import Dependency, Quantum
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
