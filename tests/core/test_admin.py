from __future__ import annotations

import json
import uuid

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils.timezone import now

from bursts.models import AgentRun, Burst, QuantumRun, Wave
from core.events import publish
from core.models import Session
from forges.models import ForgeRepository
from hooks.models import GithubDelivery, GithubLink, WebhookDelivery, WebhookEndpoint
from operations.models import Alert
from psychonauts.containment.identities import identity_slot
from psychonauts.models import AgentTurn, CommandTrauma, DiaryEntry, Mail, Role, ToolCall, Usage
from psychonauts.routing.endpoints import endpoint_add
from quanta.pipelines.services import pipelines_ensure_defaults
from quanta.services import comment_add
from repos.models import Repository
from tests.factories import make_chain

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client):
    user = User.objects.create_superuser("admin", "admin@example.com", "pw")
    client.force_login(user)
    return client


def test_every_registered_model_has_working_admin_pages(admin_client):
    a, _b = make_chain(2)
    publish("quanta", "quantum_created", {"quantum_id": a.pk})
    pipelines_ensure_defaults()
    wave = Wave.objects.create()
    burst = Burst.objects.create(wave=wave, number=1)
    run = QuantumRun.objects.create(wave=wave, burst=burst, quantum=a, pipeline_name="default")
    agent = AgentRun.objects.create(
        agent_id=f"{a.pk}_s0_coder", quantum=a, quantum_run=run, role="coder"
    )
    Session.objects.create(kind="wave", ref=str(wave.pk))
    comment_add(quantum_id=a.pk, body="a step", author="op")
    Role.objects.get_or_create(name="coder", defaults={"system_prompt": "code"})
    AgentTurn.objects.create(agent_run=agent, index=0)
    ToolCall.objects.create(agent_run=agent, turn_index=0, tool_use_id="t1", name="shell")
    Usage.objects.create(agent_run=agent, provider="scripted", model="scripted")
    Mail.objects.create(sender="a", recipient="b", body="hi")
    DiaryEntry.objects.create(agent_run=agent, kind="learning", text="step carefully")
    CommandTrauma.objects.create(pattern="rm -rf", reason="it hurt")
    identity_slot(quantum_id=a.pk)
    endpoint_add(name="local", model="llama3", base_url="http://127.0.0.1:11434/v1", enabled=False)
    Alert.objects.create(
        rule="no_worker", status="firing", value=1, threshold=1, message="step", fired_at=now()
    )
    hook = WebhookEndpoint.objects.create(
        name="ci", url="https://ci.example/h", secret_env="CI_KEY", events=["wave_completed"]
    )
    WebhookDelivery.objects.create(
        endpoint=hook, event_id=1, event="wave_completed", delivery_id=uuid.uuid4(), body="{}"
    )
    GithubDelivery.objects.create(delivery_id="d-1", event="push", outcome="woke the scheduler")
    GithubLink.objects.create(key="issue:o/r#1", quantum=a)
    forged = Repository.objects.create(name="forged", location="/srv/forged.git")
    ForgeRepository.objects.create(repository=forged, slug="o/forged", token_env="GH_TOKEN")
    # django-axes' login records: the fixture's login is logged, a wrong password makes an attempt.
    admin_client.post("/login/", {"username": "admin", "password": "wrong"})
    apps.get_model("axes", "AccessFailureLog").objects.create(
        username="admin", ip_address="127.0.0.1", path_info="/login/"
    )
    for model in admin.site._registry:
        meta = model._meta
        changelist = reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")
        assert admin_client.get(changelist).status_code == 200, changelist
        assert admin_client.get(changelist, {"q": "step"}).status_code == 200, changelist
        obj = model._default_manager.first()
        # Every model gets a row above, so every change page is opened (tether's models: step 2;
        # reflection's, the autopilot's and the api's: tests/<app>/test_admin.py).
        # A pull request needs a change review: tests/forges.
        exempt = meta.app_label in ("tether", "reflection", "autopilot", "api") or (
            meta.label == "forges.PullRequest"
        )
        assert obj is not None or exempt, f"no {meta.label} row: add one"
        if obj is not None:
            change = reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[obj.pk])
            assert admin_client.get(change).status_code == 200, change


def test_runs_and_their_record_are_read_only_in_admin(admin_client):
    for name in ["bursts_wave", "bursts_agentrun", "psychonauts_agentturn", "psychonauts_usage"]:
        assert admin_client.get(reverse(f"admin:{name}_add")).status_code == 403, name


def test_events_cannot_be_added_or_edited_in_admin(admin_client):
    event = publish("quanta", "quantum_created", {"quantum_id": 1})
    assert admin_client.get(reverse("admin:core_event_add")).status_code == 403
    response = admin_client.post(reverse("admin:core_event_change", args=[event.pk]), {"type": "x"})
    assert response.status_code == 403


def test_healthz_reports_postgres_and_redis(client, redis_client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"postgres": "ok", "redis": "ok"}


def _stage_edit_post(admin_client, **stage_changes):
    from quanta.pipeline_models import Pipeline

    pipeline = Pipeline.objects.get(name="frontend")
    url = reverse("admin:quanta_pipeline_change", args=[pipeline.pk])
    form = admin_client.get(url).context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and k != "match_labels"}
    data["match_labels"] = ",".join(pipeline.match_labels)
    data["match_kinds"] = ",".join(pipeline.match_kinds)
    data["description"] = "edited in admin"
    stages = list(pipeline.stages.order_by("index"))
    data.update(
        {
            "stages-TOTAL_FORMS": str(len(stages)),
            "stages-INITIAL_FORMS": str(len(stages)),
            "stages-MIN_NUM_FORMS": "0",
            "stages-MAX_NUM_FORMS": "1000",
        }
    )
    for i, stage in enumerate(stages):
        data.update(
            {
                f"stages-{i}-id": stage.pk,
                f"stages-{i}-pipeline": pipeline.pk,
                f"stages-{i}-index": stage.index,
                f"stages-{i}-name": stage.name,
                f"stages-{i}-mode": stage.mode,
                f"stages-{i}-agents": json.dumps(stage.agents),
                f"stages-{i}-condition": stage.condition,
                f"stages-{i}-retries": stage.retries,
                f"stages-{i}-timeout_s": stage.timeout_s,
                f"stages-{i}-verify_retries": stage.verify_retries,
                f"stages-{i}-verdict": stage.verdict,
                # An unticked checkbox is not posted at all.
                **({f"stages-{i}-verify": "on"} if stage.verify else {}),
            }
        )
    data.update({f"stages-0-{k}": v for k, v in stage_changes.items()})
    return pipeline, admin_client.post(url, data)


def test_editing_a_pipeline_in_admin_bumps_its_version(admin_client):
    pipelines_ensure_defaults()
    pipeline, response = _stage_edit_post(admin_client)
    assert response.status_code == 302, (
        response.context["adminform"].form.errors if response.context else response
    )
    pipeline.refresh_from_db()
    assert (pipeline.description, pipeline.version) == ("edited in admin", 2)


def test_the_admin_refuses_verification_options_the_loader_refuses(admin_client):
    pipelines_ensure_defaults()
    for changes in ({"verify_retries": 9}, {"verdict": "maybe"}):
        pipeline, response = _stage_edit_post(admin_client, **changes)
        assert response.status_code == 200, changes
        assert response.context["inline_admin_formsets"][0].formset.errors[0], changes
        pipeline.refresh_from_db()
        assert pipeline.version == 1


def _pipeline_post(pipeline):
    """The admin's change form of `pipeline`, as the browser would post it unchanged."""
    data = {
        "name": pipeline.name,
        "description": pipeline.description,
        "match_labels": ",".join(pipeline.match_labels),
        "match_kinds": ",".join(pipeline.match_kinds),
        "stages-TOTAL_FORMS": "0",
        "stages-INITIAL_FORMS": "0",
        "stages-MIN_NUM_FORMS": "0",
        "stages-MAX_NUM_FORMS": "1000",
    }
    if pipeline.is_default:
        data["is_default"] = "on"
    return data


def test_making_another_pipeline_the_default_in_admin_is_refused_with_a_reason(admin_client):
    pipelines_ensure_defaults()
    from quanta.pipeline_models import Pipeline

    frontend = Pipeline.objects.get(name="frontend")
    url = reverse("admin:quanta_pipeline_change", args=[frontend.pk])
    response = admin_client.post(url, {**_pipeline_post(frontend), "is_default": "on"})
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["is_default"] == [
        "'default' is the default pipeline: untick it there first (there is one default)."
    ]
    assert Pipeline.objects.get(is_default=True).name == "default"
    assert Pipeline.objects.get(name="frontend").version == frontend.version
