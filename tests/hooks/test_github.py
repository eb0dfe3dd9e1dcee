"""GitHub's deliveries at /hooks/github, through the ASGI handler: verified, refused with problem
details (and nothing written), and acted on."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from core.metrics import VALIDATION_FAILURES
from hooks.models import GithubDelivery, GithubLink
from quanta.models import Quantum
from quanta.services import quantum_close
from tests.hooks.conftest import deliver, signature

# transaction=True: the view takes deliveries in the executor's threads (their own connections).
pytestmark = pytest.mark.django_db(transaction=True)


def refusals() -> float:
    return float(VALIDATION_FAILURES.labels(entry="webhook")._value.get())


def assert_refused(response: Any, status: int, title: str) -> None:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    problem = json.loads(response.content)
    assert problem["status"] == status
    assert problem["title"] == title
    assert problem["detail"]
    assert problem["instance"] == "/hooks/github"


def queued_tasks(client: redis.Redis) -> list[str]:
    """The task names waiting in the broker's default queue."""
    return [json.loads(m)["headers"]["task"] for m in client.lrange("celery", 0, -1)]


def check_run(
    conclusion: str = "failure", branch: str = "main", name: str = "tests"
) -> dict[str, Any]:
    return {
        "action": "completed",
        "repository": {"full_name": "acme/widgets"},
        "check_run": {
            "name": name,
            "conclusion": conclusion,
            "head_sha": "0123456789abcdef0123",
            "html_url": "https://github.com/acme/widgets/runs/1",
            "output": {"summary": "2 tests failed"},
            "check_suite": {"head_branch": branch},
        },
    }


def issue(
    number: int = 7, labels: tuple[str, ...] = ("annihilation",), action: str = "opened"
) -> dict[str, Any]:
    return {
        "action": action,
        "repository": {"full_name": "acme/widgets"},
        "issue": {
            "number": number,
            "title": "The widget squeaks",
            "body": "Steps: turn it. Token sk-ant-api03-AbCdEfGhIjKlMnOpQrStUv leaked here.",
            "html_url": f"https://github.com/acme/widgets/issues/{number}",
            "labels": [{"name": name} for name in labels],
        },
    }


# --- refusals -----------------------------------------------------------------------------------


def test_it_accepts_a_validly_signed_ping(github):
    response = deliver("ping", {"zen": "Keep it logically awesome."}, delivery="ping-1")
    assert response.status_code == 202
    assert json.loads(response.content)["outcome"] == "pong"
    assert GithubDelivery.objects.get(delivery_id="ping-1").event == "ping"


def test_it_refuses_a_bad_signature_and_writes_nothing(github):
    before = refusals()
    response = deliver("issues", issue(), sign="sha256=" + "0" * 64)
    assert_refused(response, 401, "Bad signature")
    assert not GithubDelivery.objects.exists() and not Quantum.objects.exists()
    assert refusals() == before + 1


def test_it_refuses_a_body_signed_with_another_secret(github):
    body = json.dumps(issue()).encode()
    response = deliver("issues", body=body, sign=signature(body, "another-secret"))
    assert_refused(response, 401, "Bad signature")
    assert not Quantum.objects.exists()


def test_it_refuses_a_missing_signature(github):
    response = deliver("ping", {}, headers={"X-Hub-Signature-256": ""}, sign="")
    assert_refused(response, 401, "Signature missing")


def test_it_refuses_a_replayed_delivery(github):
    first = deliver("issues", issue(), delivery="same-id")
    assert first.status_code == 202
    before = refusals()
    again = deliver("issues", issue(), delivery="same-id")
    assert_refused(again, 409, "Delivery replayed")
    assert GithubDelivery.objects.count() == 1
    assert Quantum.objects.count() == 1
    assert refusals() == before + 1


def test_it_refuses_an_oversized_body(github):
    github.HOOKS_GITHUB_MAX_BYTES = 1000
    response = deliver("ping", {"padding": "x" * 2000})
    assert_refused(response, 413, "Delivery too large")
    assert not GithubDelivery.objects.exists()


def test_it_refuses_an_unknown_event_type(github):
    response = deliver("deployment_status", {"action": "created"})
    assert_refused(response, 400, "Unknown event type")
    assert not GithubDelivery.objects.exists()


def test_it_refuses_malformed_json(github):
    response = deliver("push", body=b'{"ref": "refs/heads/main",')
    assert_refused(response, 400, "Malformed JSON")
    assert not GithubDelivery.objects.exists()


def test_it_refuses_a_payload_of_the_wrong_shape_and_writes_nothing(github):
    response = deliver("issues", {"action": "opened", "issue": {"number": "seven"}})
    assert_refused(response, 400, "Malformed payload")
    assert not GithubDelivery.objects.exists()


def _with(payload: dict[str, Any], path: tuple[str, ...], value: Any) -> bytes:
    """The payload as JSON with `value` at `path`, escaped as GitHub (or an attacker) would."""
    target = payload
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = "@@VALUE@@"
    return json.dumps(payload).replace('"@@VALUE@@"', value).encode()


# Bodies that parse, or nearly, into what nothing downstream can hold: each answered with a
# problem document and nothing written, through the ASGI fast path and the Django view alike.
ODD_BODIES = {
    "nested past the parser's recursion": b'{"zen": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
    "nested past any GitHub event": b'{"zen": ' + b"[" * 100 + b"]" * 100 + b"}",
    "a lone surrogate in repository.full_name": _with(
        issue(), ("repository", "full_name"), '"acme/\\ud800widgets"'
    ),
    "a lone surrogate in a key": b'{"zen": {"\\udfff": 1}}',
    "a NUL in the issue's title": _with(issue(), ("issue", "title"), '"squeaks\\u0000"'),
}


@pytest.mark.parametrize("body", ODD_BODIES.values(), ids=ODD_BODIES.keys())
def test_an_oddly_parsing_body_gets_a_problem_document_never_a_500(github, client, body):
    before = refusals()
    response = deliver("issues", body=body)
    assert 400 <= response.status_code < 500
    assert response["Content-Type"] == "application/problem+json"
    assert json.loads(response.content)["title"] in {"Malformed JSON", "Malformed payload"}
    via_view = client.post(
        "/hooks/github", body, content_type="application/json",
        headers={"X-GitHub-Event": "issues", "X-GitHub-Delivery": "odd-via-view",
                 "X-Hub-Signature-256": signature(body)},
    )  # fmt: skip
    assert 400 <= via_view.status_code < 500
    assert via_view["Content-Type"] == "application/problem+json"
    assert refusals() == before + 2
    assert not GithubDelivery.objects.exists() and not Quantum.objects.exists()


@pytest.mark.parametrize("odd", [{"a": 1}, ["completed"], 7, None, "x" * 10_000])
def test_fields_of_any_type_are_acted_on_or_ignored_never_a_500(github, odd):
    failing = check_run()
    failing["action"] = odd
    failing["check_run"]["conclusion"] = odd
    labelled = issue()
    labelled["action"] = odd
    for event, payload in (("check_run", failing), ("issues", labelled)):
        response = deliver(event, payload)
        assert response.status_code in (202, 400), response.content
        assert len(response.content) < 2_000
    assert not Quantum.objects.exists()


def test_labels_of_any_shape_are_read_without_failing(github):
    payload = issue()
    payload["issue"]["labels"] = [{"name": {"a": 1}}, {"name": ["x"]}, {"name": "annihilation"}]
    response = deliver("issues", payload)
    assert response.status_code == 202 and Quantum.objects.count() == 1


def test_it_refuses_everything_while_no_secret_is_configured(github):
    github.HOOKS_GITHUB_SECRET = ""
    response = deliver("ping", {})
    assert_refused(response, 503, "Webhooks not configured")


def test_it_refuses_other_methods(github, client):
    assert client.get("/hooks/github").status_code == 405


# --- actions ------------------------------------------------------------------------------------


def test_a_push_to_the_base_branch_wakes_the_scheduler(github, redis_client):
    response = deliver("push", {"ref": "refs/heads/main"})
    assert response.status_code == 202
    assert "scheduler woken" in json.loads(response.content)["outcome"]
    assert queued_tasks(redis_client) == ["autopilot.tick"]


def test_a_push_to_another_branch_is_recorded_and_ignored(github, redis_client):
    response = deliver("push", {"ref": "refs/heads/feature"}, delivery="p2")
    assert response.status_code == 202
    assert queued_tasks(redis_client) == []
    assert GithubDelivery.objects.get(delivery_id="p2").outcome.startswith("ignored")


def test_a_failed_check_run_files_one_healing_quantum_until_it_is_closed(github):
    response = deliver("check_run", check_run())
    assert response.status_code == 202
    quantum = Quantum.objects.get()
    assert quantum.priority == 0 and quantum.kind == "bug"
    assert {"autopilot", "autopilot:healing", "healing", "github"} <= set(quantum.labels)
    assert "tests" in quantum.title and "2 tests failed" in quantum.body
    assert json.loads(response.content)["quantum_id"] == quantum.pk

    again = deliver("check_run", check_run(conclusion="timed_out"))
    assert json.loads(again.content)["quantum_id"] == quantum.pk
    assert Quantum.objects.count() == 1

    quantum_close(quantum_id=quantum.pk, reason="fixed")
    third = deliver("check_run", check_run())
    assert Quantum.objects.count() == 2
    assert GithubLink.objects.get().quantum_id == json.loads(third.content)["quantum_id"]


def test_a_check_that_passed_or_failed_elsewhere_files_nothing(github):
    assert deliver("check_run", check_run(conclusion="success")).status_code == 202
    assert deliver("check_run", check_run(branch="feature")).status_code == 202
    assert not Quantum.objects.exists()
    assert GithubDelivery.objects.count() == 2


def test_a_failed_workflow_run_files_a_healing_quantum(github):
    payload = {
        "action": "completed",
        "repository": {"full_name": "acme/widgets"},
        "workflow_run": {"name": "CI", "conclusion": "failure", "head_branch": "main",
                         "head_sha": "abc", "html_url": "https://github.com/acme/widgets/actions/runs/9"},
    }  # fmt: skip
    response = deliver("workflow_run", payload)
    assert response.status_code == 202
    quantum = Quantum.objects.get()
    assert "workflow CI" in quantum.title and "healing" in quantum.labels


def test_a_labelled_issue_becomes_one_quantum(github):
    response = deliver("issues", issue())
    assert response.status_code == 202
    quantum = Quantum.objects.get()
    assert quantum.title == "The widget squeaks (#7)"
    assert "github" in quantum.labels
    assert "https://github.com/acme/widgets/issues/7" in quantum.body
    assert "AbCdEfGhIjKlMnOpQrStUv" not in quantum.body  # redacted

    deliver("issues", issue(action="labeled"))
    deliver("issues", issue(action="reopened"))
    assert Quantum.objects.count() == 1


def test_an_issue_without_the_label_is_ignored(github):
    assert deliver("issues", issue(labels=("bug",))).status_code == 202
    assert deliver("issues", issue(action="closed")).status_code == 202
    assert not Quantum.objects.exists()


def test_the_same_delivery_twice_at_once_is_taken_once(github):
    """Two copies of a labelled issue's delivery in parallel: one quantum, one 202, one 409."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        responses = list(pool.map(lambda _: deliver("issues", issue(), delivery="twin"), range(2)))
    assert sorted(r.status_code for r in responses) == [202, 409]
    assert Quantum.objects.count() == 1 and GithubDelivery.objects.count() == 1


def test_it_answers_with_the_request_id_it_was_given(github):
    response = deliver("ping", {}, headers={"X-Request-ID": "gh-req-42"})
    assert response.status_code == 202 and response["X-Request-ID"] == "gh-req-42"
    assert len(deliver("ping", {}, headers={"X-Request-ID": "not plain!"})["X-Request-ID"]) == 32


def test_the_django_view_gives_the_same_answers(github, client):
    """The URL served through Django (WSGI, the test client) behaves as the ASGI fast path."""
    body = json.dumps(issue()).encode()
    headers = {"X-GitHub-Event": "issues", "X-GitHub-Delivery": "via-view"}
    bad = client.post("/hooks/github", body, content_type="application/json",
                      headers={**headers, "X-Hub-Signature-256": "sha256=00"})  # fmt: skip
    assert_refused(bad, 401, "Bad signature")
    good = client.post("/hooks/github", body, content_type="application/json",
                       headers={**headers, "X-Hub-Signature-256": signature(body)})  # fmt: skip
    assert good.status_code == 202 and Quantum.objects.count() == 1
