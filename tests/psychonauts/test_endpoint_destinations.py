"""Where the worker sends a model endpoint's key: never to a link-local or cloud metadata
address, to loopback or a private network only with ENDPOINTS_ALLOW_PRIVATE, and only from the
environment variables ENDPOINTS_KEY_ENVS names. Checked when an endpoint is added, before each
health check and before each model call; a refused one is sent nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from psychonauts.models import Endpoint, HealthStatus
from psychonauts.routing import endpoints
from psychonauts.routing.endpoints import EndpointInvalid, endpoint_add
from psychonauts.runtime.execute import agent_run_execute
from psychonauts.tasks import endpoints_health

pytestmark = pytest.mark.django_db

METADATA_URLS = [
    "http://169.254.169.254/v1",
    "http://169.254.170.2/v1",
    "http://[fd00:ec2::254]/v1",
    "http://[::ffff:169.254.169.254]/v1",
    "http://[::ffff:a9fe:a9fe]/v1",
    "http://[fe80::1]:11434/v1",
    "http://169.254.10.20:11434/v1",
    "http://100.100.100.200/v1",
    "http://metadata.google.internal/v1",
    "http://0.0.0.0:11434/v1",
]
PRIVATE_URLS = [
    "http://127.0.0.1:11434/v1",
    "http://localhost:11434/v1",
    "http://[::1]:11434/v1",
    "http://10.0.0.7:8000/v1",
    "http://172.16.5.4/v1",
    "http://192.168.1.20:11434/v1",
]


@pytest.fixture(autouse=True)
def fresh(settings: Any, redis_client: Any) -> Iterator[None]:
    settings.ENDPOINTS_CACHE_S = 0
    settings.PSYCHONAUTS_PROVIDER_RETRIES = 1
    endpoints.registry_invalidate()
    yield
    endpoints.registry_invalidate()


class Recorder:
    """A server that records every request it is sent (any method, its headers) and answers
    as an OpenAI-compatible server would list its models."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.base_url = ""


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    state = Recorder()

    class Handler(BaseHTTPRequestHandler):
        def _record(self) -> None:
            state.requests.append(
                (self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
            )
            body = b'{"object": "list", "data": [{"id": "m", "object": "model"}]}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _record

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("url", METADATA_URLS)
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_it_never_adds_an_endpoint_at_a_metadata_or_link_local_address(url, provider, settings):
    settings.ENDPOINTS_ALLOW_PRIVATE = True  # not even with private addresses allowed
    with pytest.raises(EndpointInvalid, match="base_url"):
        endpoint_add(name="meta", model="m", base_url=url, provider=provider)
    assert not Endpoint.objects.exists()


@pytest.mark.parametrize("url", PRIVATE_URLS)
def test_a_loopback_or_private_endpoint_needs_the_opt_in(url, settings):
    settings.ENDPOINTS_ALLOW_PRIVATE = False
    with pytest.raises(EndpointInvalid, match="ANNIHILATION_ENDPOINTS_ALLOW_PRIVATE"):
        endpoint_add(name="local", model="m", base_url=url)
    settings.ENDPOINTS_ALLOW_PRIVATE = True
    assert endpoint_add(name="local", model="m", base_url=url).pk


@pytest.mark.parametrize(
    "name", ["AWS_SECRET_ACCESS_KEY", "DATABASE_URL", "ANNIHILATION_GITHUB_WEBHOOK_SECRET", "HOME"]
)
def test_an_endpoint_names_only_an_allowed_key_variable(name, recorder):
    with pytest.raises(EndpointInvalid, match="ANNIHILATION_ENDPOINTS_KEY_ENVS"):
        endpoint_add(name="gw", model="m", base_url=recorder.base_url, api_key_env=name)
    assert not Endpoint.objects.exists()


def test_the_default_list_takes_the_usual_names_and_the_projects_prefix(recorder, settings):
    for n, name in enumerate(["OPENAI_API_KEY", "VLLM_API_KEY", "ANNIHILATION_ENDPOINT_KEY_GPU1"]):
        endpoint_add(name=f"gw{n}", model="m", base_url=recorder.base_url, api_key_env=name)
    settings.ENDPOINTS_KEY_ENVS = ["MY_GATEWAY_*"]
    endpoint_add(name="gw9", model="m", base_url=recorder.base_url, api_key_env="MY_GATEWAY_KEY")
    with pytest.raises(EndpointInvalid):
        endpoint_add(
            name="gwx", model="m", base_url=recorder.base_url, api_key_env="OPENAI_API_KEY"
        )


def test_the_health_check_sends_no_key_where_it_may_not(recorder, settings, monkeypatch):
    """Rows the checks at add time did not refuse (the settings changed since, or a row written
    around the service) are refused by the check itself: down, with the reason, nothing sent."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-api03-worker-key-0123456789abcdef")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    endpoint_add(name="local", model="m", base_url=recorder.base_url, provider="anthropic")
    Endpoint.objects.create(
        name="aws", model="m", base_url=recorder.base_url, api_key_env="AWS_SECRET_ACCESS_KEY"
    )
    Endpoint.objects.create(name="meta", model="m", base_url="http://169.254.169.254/v1")
    settings.ENDPOINTS_ALLOW_PRIVATE = False

    assert endpoints_health() == 3

    rows = {e.name: e for e in Endpoint.objects.all()}
    assert all(row.health == HealthStatus.DOWN for row in rows.values())
    assert "ANNIHILATION_ENDPOINTS_ALLOW_PRIVATE" in rows["local"].health_reason
    assert "ANNIHILATION_ENDPOINTS_KEY_ENVS" in rows["aws"].health_reason
    assert "metadata" in rows["meta"].health_reason
    assert recorder.requests == []

    settings.ENDPOINTS_ALLOW_PRIVATE = True  # the opt-in: the local one is asked (with the key)
    endpoints_health()
    assert "ALLOW_PRIVATE" not in Endpoint.objects.get(name="local").health_reason
    assert len(recorder.requests) == 1  # the local one only: never the other two
    assert "sk-ant-api03-worker-key-0123456789abcdef" in str(recorder.requests[0][2].values())


def test_a_model_call_sends_no_key_where_it_may_not(
    recorder, repo, make_quantum, make_run, settings, monkeypatch
):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    Endpoint.objects.create(
        name="aws", model="m", base_url=recorder.base_url, api_key_env="AWS_SECRET_ACCESS_KEY"
    )
    run = make_run(
        "planner", quantum=make_quantum("Add a greeting", complexity="standard"), provider="openai"
    )

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert "ANNIHILATION_ENDPOINTS_KEY_ENVS" in outcome.error
    assert recorder.requests == []
