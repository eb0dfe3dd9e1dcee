"""Approving several changes from the Grounding page in Chromium: the operator selects two of
three pending changes and approves them; then approves all low-risk ones; the merge queue takes
exactly those (the rules of `manage.py tether approve`)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from bursts.models import Wave
from bursts.services import wave_start
from core.access import operator_ensure
from psychonauts.roles import roles_sync_defaults
from quanta.services import quantum_create
from tests.bursts.conftest import pipeline
from tests.polling import wait_for
from tether.models import ChangeReview

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_operator_approves_a_selection_then_all_low_risk(control_room, page, login):
    roles_sync_defaults()
    operator_ensure(username="operator", password="correct horse")
    pipeline("solo", ("sequential", ["coder"]), labels=["solo"])
    quanta = [quantum_create(title=f"Note {n}", labels=["solo"]) for n in range(3)]
    wave = wave_start(labels=["solo"])
    wait_for(lambda: Wave.objects.get(pk=wave.pk).status == "done", 90, what="the wave")
    changes = wait_for(
        lambda: (
            list(ChangeReview.objects.filter(quantum__in=quanta).order_by("pk"))
            if ChangeReview.objects.filter(quantum__in=quanta).count() == 3
            else None
        ),
        60,
        what="three change reviews",
    )
    assert all(c.status == "pending" and c.risk == "low" for c in changes), changes
    first, second, third = changes

    login(control_room, "operator", "correct horse")
    page.goto(f"{control_room}/grounding/")
    page.check(f"#select-change-{first.pk}")
    page.check(f"#select-change-{third.pk}")
    page.click("#approve-selected")

    expect(page.locator("ul.messages")).to_contain_text(
        f"2 change(s) in the merge queue: #{first.pk}, #{third.pk}."
    )
    statuses = {c.pk: c.status for c in ChangeReview.objects.filter(pk__in=[c.pk for c in changes])}
    assert statuses[second.pk] == "pending"
    assert statuses[first.pk] != "pending" and statuses[third.pk] != "pending"

    page.click("#approve-low-risk")
    expect(page.locator("ul.messages")).to_contain_text(
        f"1 change(s) in the merge queue: #{second.pk}."
    )
    assert ChangeReview.objects.get(pk=second.pk).status != "pending"
