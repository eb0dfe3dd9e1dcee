from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from bursts.models import AgentRun, Burst, QuantumRun, Wave
from core.events import publish
from quanta.models import Quantum
from quanta.pipelines.services import pipelines_ensure_defaults
from tests.factories import make_chain, make_quantum

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    """A chain of three quanta, a wave with a burst, a run and an agent with events."""
    chain = make_chain(3, prefix="ui step")
    pipelines_ensure_defaults()
    wave = Wave.objects.create(labels=["ui"])
    burst = Burst.objects.create(wave=wave, number=1)
    run = QuantumRun.objects.create(
        wave=wave, burst=burst, quantum=chain[0], pipeline_name="default", status="running"
    )
    agent = AgentRun.objects.create(
        agent_id=f"{chain[0].pk}_s0_coder",
        quantum=chain[0],
        quantum_run=run,
        role="coder",
        status="running",
        phase="thinking",
    )
    publish(f"agent:{agent.agent_id}", "text", {"agent_run_id": agent.pk, "text": "hello there"})
    publish(
        f"agent:{agent.agent_id}",
        "tool_call",
        {"agent_run_id": agent.pk, "id": "t1", "name": "read_file", "input": {"path": "a.py"}},
    )
    return {"chain": chain, "wave": wave, "run": run, "agent": agent}


def test_it_sends_anonymous_users_to_the_login_page(client):
    for url in ["/", "/quanta/", "/waves/", "/pipelines/", "/quanta/1/"]:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/login/"), url


def test_it_logs_in_with_the_form(client, operator):
    response = client.post("/login/", {"username": "op", "password": "wrong"})
    assert response.status_code == 200 and b"correct username and password" in response.content
    response = client.post("/login/", {"username": "op", "password": "pw-operator"})
    assert response.status_code == 302 and response["Location"] == "/"


def test_healthz_needs_no_login(client, redis_client):
    assert client.get("/healthz").status_code == 200


def test_it_renders_every_page_for_a_viewer(viewer_client, world):
    chain, wave, agent = world["chain"], world["wave"], world["agent"]
    pages = {
        "/": [b"Wave " + str(wave.pk).encode(), b"Celery queues", b"Live agents"],
        "/quanta/": [b"ui step 1"],
        f"/quanta/{chain[1].pk}/": [b"dependency-graph", b"is not ready", b"ui step 0"],
        f"/waves/{wave.pk}/": [b"wave-timeline", b"burst 1"],
        "/waves/": [b"wave " + str(wave.pk).encode()],
        "/pipelines/": [b"pipeline-diagram", b"default"],
        f"/agents/{agent.pk}/": [b"hello there", b"read_file"],
    }
    for url, needles in pages.items():
        response = viewer_client.get(url)
        assert response.status_code == 200, url
        for needle in needles:
            assert needle in response.content, (url, needle)
        # A viewer sees no action buttons.
        assert b"wave-start" not in response.content, url
        assert b"Cancel wave" not in response.content, url
        assert b"quantum-actions" not in response.content, url


def test_an_operator_sees_the_action_forms(op_client, world):
    assert b'id="wave-start"' in op_client.get("/").content
    assert b"Cancel wave" in op_client.get("/").content
    assert b"quantum-actions" in op_client.get(f"/quanta/{world['chain'][0].pk}/").content


def test_unknown_ids_are_404(viewer_client):
    for url in ["/quanta/999999/", "/waves/999999/", "/agents/999999/"]:
        assert viewer_client.get(url).status_code == 404, url


def test_a_viewer_cannot_act(viewer_client, world):
    q = world["chain"][0]
    posts = [
        ("/waves/start/", {"labels": ""}),
        (f"/waves/{world['wave'].pk}/cancel/", {}),
        ("/quanta/new/", {"title": "x", "kind": "task", "priority": 2, "complexity": "standard"}),
        (f"/quanta/{q.pk}/edit/", {"title": "renamed"}),
        (f"/quanta/{q.pk}/comment/", {"body": "hi"}),
        (f"/quanta/{q.pk}/close/", {"reason": "r"}),
        (f"/quanta/{q.pk}/reopen/", {}),
        (f"/quanta/{q.pk}/defer/", {}),
        (f"/quanta/{q.pk}/dependencies/", {"depends_on": world["chain"][2].pk}),
    ]
    for url, data in posts:
        assert viewer_client.post(url, data).status_code == 403, url
    assert viewer_client.get("/quanta/new/").status_code == 403
    assert Wave.objects.get(pk=world["wave"].pk).status == "running"
    assert Quantum.objects.filter(title="x").count() == 0
    assert not q.comments.exists()


def test_the_list_filters_searches_and_paginates(viewer_client, settings):
    settings.UI_PAGE_SIZE = 2
    make_quantum("alpha widget", labels=["front"], priority=1)
    make_quantum("beta widget", labels=["back"])
    make_quantum("gamma gadget", labels=["front"])
    page1 = viewer_client.get("/quanta/")
    assert page1.context["page"].paginator.count == 3 and len(page1.context["page"]) == 2
    assert b"next-page" in page1.content
    assert [q.title for q in viewer_client.get("/quanta/?label=front").context["page"]] == [
        "alpha widget",
        "gamma gadget",
    ]
    found = viewer_client.get("/quanta/?q=widget -beta").context["page"]
    assert [q.title for q in found] == ["alpha widget"]
    bad = viewer_client.get("/quanta/?q=-only")
    assert bad.status_code == 200 and b"at least one term" in bad.content


def test_an_operator_creates_and_edits_a_quantum_with_errors_next_to_fields(op_client):
    blocker = make_quantum("the blocker")
    bad = op_client.post(
        "/quanta/new/",
        {"title": "", "kind": "task", "priority": 9, "complexity": "standard"},
    )
    assert bad.status_code == 400
    assert bad.context["form"].errors.keys() == {"title", "priority"}
    bad_label = op_client.post(
        "/quanta/new/",
        {"title": "t", "kind": "task", "priority": 2, "complexity": "standard", "labels": "!!"},
    )
    assert bad_label.status_code == 400 and "labels" in bad_label.context["form"].errors
    response = op_client.post(
        "/quanta/new/",
        {
            "title": "new one",
            "kind": "bug",
            "priority": 1,
            "complexity": "standard",
            "labels": "ui, web",
            "depends_on": f"#{blocker.pk}",
        },
    )
    assert response.status_code == 302
    created = Quantum.objects.get(title="new one")
    assert created.labels == ["ui", "web"] and created.open_blockers == 1
    edit = reverse("quantum_edit", args=[created.pk])
    form = op_client.get(edit).context["form"]
    data = {k: v for k, v in form.initial.items() if v is not None}
    data["title"] = "renamed"
    assert op_client.post(edit, data).status_code == 302
    created.refresh_from_db()
    assert created.title == "renamed" and created.labels == ["ui", "web"]
    cyclic = op_client.post(
        reverse("quantum_dependency_add", args=[blocker.pk]),
        {"depends_on": created.pk},
        follow=True,
    )
    assert b"cycle" in cyclic.content


def test_stale_actions_say_so_and_change_nothing(op_client):
    q = make_quantum("to close")
    url = reverse("quantum_close", args=[q.pk])
    op_client.post(url, {"reason": "done by hand"})
    again = op_client.post(url, {"reason": "twice"}, follow=True)
    assert b"cannot close quantum" in again.content
    q.refresh_from_db()
    assert q.close_reason == "done by hand"


def test_cancelling_an_ended_wave_is_stale(op_client):
    wave = Wave.objects.create(status="done")
    response = op_client.post(reverse("wave_cancel", args=[wave.pk]), follow=True)
    assert b"nothing to cancel" in response.content
    assert Wave.objects.get(pk=wave.pk).status == "done"


def test_the_wave_form_validates_labels(op_client):
    response = op_client.post("/waves/start/", {"labels": "ok, b@d!"})
    assert response.status_code == 400
    assert "labels" in response.context["start_form"].errors
    assert not Wave.objects.exists()


def test_the_dashboard_reads_in_a_fixed_number_of_queries(viewer_client, world):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    counts = []
    for size in (5, 15):
        for i in range(size):
            q = make_quantum(f"extra {size} {i}")
            run = QuantumRun.objects.create(
                wave=world["wave"], burst=world["run"].burst, quantum=q, pipeline_name="default"
            )
            AgentRun.objects.create(
                agent_id=f"{q.pk}_s0_coder", quantum=q, quantum_run=run, role="coder"
            )
        with CaptureQueriesContext(connection) as queries:
            assert viewer_client.get("/").status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1], counts  # none per run or agent
    # every card's reads (the alerts', the hosts', the totals', the failed environments')
    assert counts[0] <= 21, counts


def test_the_migration_makes_operators_who_may_act_and_viewers_who_may_not():
    from django.contrib.auth.models import Group

    from core.access import operator_ensure, user_can_operate, viewer_ensure

    assert Group.objects.get(name="operators").permissions.filter(codename="operate").exists()
    assert not Group.objects.get(name="viewers").permissions.exists()
    op = operator_ensure(username="ops", password="first")
    again = operator_ensure(username="ops", password="second")
    assert again.pk == op.pk and again.check_password("second")
    assert user_can_operate(User.objects.get(pk=op.pk))
    assert not user_can_operate(User.objects.get(pk=viewer_ensure(username="v", password="p").pk))
