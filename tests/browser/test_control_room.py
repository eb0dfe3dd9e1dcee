from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection
from playwright.sync_api import expect

from bursts.models import AgentRun, Wave
from core.access import operator_ensure, viewer_ensure
from psychonauts.roles import roles_sync_defaults
from quanta.importer import quanta_import
from quanta.models import Quantum
from quanta.selectors import quanta_blocked
from tests.bursts.conftest import ROOT
from tether.errors import TetherError
from tether.models import Reaching, ReachingStatus
from tether.services import reaching_answer

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Counts live messages from the first script on: proves the page changed without a reload.
COUNT_EVENTS = """
window.__liveEvents = 0;
document.addEventListener("annihilation:event", () => { window.__liveEvents += 1; });
"""


@contextmanager
def tether_answering(labels: list[str]) -> Iterator[None]:
    """Stand in for the Tether as `make demo` does: answer the demo's `ask` question when it is
    pending (the `ask-drift` one times out by itself). Answering in the UI has its own test."""
    stop = threading.Event()

    def answer() -> None:
        try:
            while not stop.wait(0.1):
                pending = Reaching.objects.filter(
                    status=ReachingStatus.PENDING, quantum__labels__contains=labels
                ).values_list("pk", flat=True)
                for reaching_id in pending:
                    try:
                        reaching_answer(reaching_id=reaching_id, text="keep it", by="test")
                    except TetherError:
                        continue
        finally:
            connection.close()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def test_an_operator_starts_the_demo_wave_and_watches_it_complete(
    control_room, page, login, screenshot
):
    roles_sync_defaults()
    ids = quanta_import(path=ROOT / "demo" / "quanta.yaml")
    blocked = quanta_blocked().first()
    operator_ensure(username="operator", password="correct horse")

    page.goto(f"{control_room}/")
    expect(page).to_have_url(re.compile(r"/login/\?next=/$"))
    page.fill("#id_username", "operator")
    page.fill("#id_password", "wrong")
    page.click("#login-submit")
    expect(page.locator(".errornote")).to_be_visible()
    screenshot("login")
    login(control_room, "operator", "correct horse")
    screenshot("dashboard-before")

    page.add_init_script(COUNT_EVENTS)
    page.fill("#id_labels", "!bad label")
    page.click("#wave-start")
    expect(page.locator("#wave-start-form .errorlist")).to_be_visible()
    assert not Wave.objects.exists()
    page.fill("#id_labels", "demo")
    page.click("#wave-start")
    expect(page.locator(".messages .success")).to_contain_text("started")
    page.evaluate("window.__sameDocument = true")
    expect(page.locator("#live-status")).to_have_text("live")
    # The runs finish while we look: the summary is swapped in by websocket fragments.
    with tether_answering(["demo", "ask"]):
        expect(page.locator("#wave-status")).to_have_text("done", timeout=90_000)
    assert page.evaluate("window.__sameDocument") is True  # never reloaded
    assert page.evaluate("window.__liveEvents") > 0
    done = int(page.locator('#runs-by-status [data-status="done"]').inner_text())
    assert done >= 1
    expect(page.locator("#recent-events li").first).to_be_visible()
    screenshot("dashboard-after-wave")

    wave = Wave.objects.get()
    assert wave.status == "done"
    page.goto(f"{control_room}/waves/{wave.pk}/")
    expect(page.locator("#wave-timeline svg rect").first).to_be_visible()
    expect(page.locator("#wave-reflection-runs tr[data-status]").first).to_be_visible()
    screenshot("wave-timeline")
    page.goto(f"{control_room}/waves/")
    screenshot("waves")

    page.goto(f"{control_room}/quanta/")
    expect(page.locator("#quanta-table")).to_contain_text(Quantum.objects.get(pk=ids[0]).title)
    screenshot("quanta-list")
    page.goto(f"{control_room}/quanta/?q=test*")
    screenshot("quanta-search")
    target = blocked.pk if blocked is not None else ids[-1]
    page.goto(f"{control_room}/quanta/{target}/")
    expect(page.locator("#dependency-graph")).to_be_visible()
    expect(page.locator("#why-not-ready")).to_be_visible()
    screenshot("quantum-detail")
    page.goto(f"{control_room}/quanta/{target}/edit/")
    page.fill("#id_title", "")
    page.click("#quantum-form button[type=submit]")
    expect(page.locator("#field-title .errorlist")).to_be_visible()
    screenshot("quantum-edit-error")
    page.goto(f"{control_room}/quanta/new/")
    screenshot("quantum-new")

    agent = AgentRun.objects.filter(status="done").order_by("id").first()
    assert agent is not None
    page.goto(f"{control_room}/agents/{agent.pk}/")
    expect(page.locator("#stream li").first).to_be_visible()
    expect(page.locator("#focus-playbook")).to_be_visible()
    screenshot("focus")
    page.goto(f"{control_room}/pipelines/")
    expect(page.locator(".pipeline-diagram").first).to_be_visible()
    screenshot("pipelines")


def test_a_viewer_cannot_act(control_room, page, login, screenshot):
    viewer_ensure(username="viewer", password="just looking")
    quantum_id = quanta_import(path=ROOT / "demo" / "quanta.yaml")[0]
    login(control_room, "viewer", "just looking")
    expect(page.locator("header")).to_contain_text("viewer")
    assert page.locator("#wave-start").count() == 0
    screenshot("dashboard-viewer")
    page.goto(f"{control_room}/quanta/{quantum_id}/")
    assert page.locator("#quantum-actions").count() == 0
    assert page.locator("#quantum-edit").count() == 0
    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    headers = {"X-CSRFToken": csrf, "Referer": f"{control_room}/"}
    response = page.request.post(
        f"{control_room}/waves/start/", form={"labels": "demo"}, headers=headers
    )
    assert response.status == 403
    response = page.request.post(
        f"{control_room}/quanta/{quantum_id}/close/", form={"reason": "no"}, headers=headers
    )
    assert response.status == 403
    assert not Wave.objects.exists()
    assert Quantum.objects.get(pk=quantum_id).status != "closed"
