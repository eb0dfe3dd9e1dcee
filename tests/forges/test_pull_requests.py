"""Pull requests on a fake GitHub served on loopback: a wave's changes become pull requests,
reviews and checks come back (through /hooks/github and the poll), an approved green pull
request is merged by the merge queue through the forge, a crash between push and opening opens
exactly one, and the forge's 403 / 422 / 5xx answers."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.utils import timezone

from bursts.models import Wave
from core.redaction import redact
from forges.errors import ForgeNotConfigured, ForgeUnavailable
from forges.models import PullRequest, PullState
from forges.services import (
    SYNC_TASK,
    forge_configure,
    pull_request_publish,
    pull_request_sync,
    pull_requests_due,
)
from psychonauts.containment.sandbox import sandbox_run
from psychonauts.workspaces.worktrees import workspace_ensure
from quanta.models import Comment, Quantum, QuantumStatus
from repos.services import repository_default
from tests.fakes.github_server import LOST, FakeGitHub
from tests.forges.conftest import TOKEN, MakeQuantum, done_run
from tests.hooks.conftest import GITHUB_SECRET, deliver
from tether.models import ChangeReview, ChangeStatus
from tether.services import change_review_create
from tether.services.merge_queue import merge_queue_run

PULLS = r"/repos/acme/widgets/pulls"


def published(quantum: Quantum, files: dict[str, str], wave: Wave | None = None) -> PullRequest:
    """The quantum's run done, reviewed, and its pull request published."""
    run = done_run(quantum, files, wave)
    review = change_review_create(quantum_run_id=run.pk)
    assert review is not None
    pull = PullRequest.objects.get(change=review)
    pull_request_publish(pull_id=pull.pk)
    pull.refresh_from_db()
    return pull


def test_a_waves_changes_become_pull_requests(
    github: FakeGitHub, forge: Any, make_quantum: MakeQuantum, forge_settings: Any
):
    forge_settings.TETHER_AUTO_MERGE_LOW_RISK = True  # the forge's reviewers decide, not us
    wave = Wave.objects.create(status="done")
    first = make_quantum("Greet the user", body="Say hello on start.")
    second = make_quantum("Log the start")
    pulls = [
        published(first, {"hello.py": "print('hi')\n"}, wave),
        published(second, {"start.log.py": "import logging\n"}, wave),
    ]

    opened = github.open_pulls()
    assert sorted(p["head"]["ref"] for p in opened) == sorted(p.branch for p in pulls)
    for pull in pulls:
        review = ChangeReview.objects.get(pk=pull.change_id)
        assert review.status == ChangeStatus.PENDING
        assert (
            pull.state == PullState.OPEN
            and pull.number
            and pull.url.endswith(f"/pull/{pull.number}")
        )
        assert github.branch_sha(pull.branch) == review.head_sha == pull.head_sha
        on_forge = next(p for p in opened if p["number"] == pull.number)
        assert on_forge["base"]["ref"] == "main"
        assert [label["name"] for label in on_forge["labels"]] == [f"risk:{review.risk}"]
    body = next(p for p in opened if p["number"] == pulls[0].number)["body"]
    assert f"[#{first.pk}](https://annihilation.example/quanta/{first.pk}/)" in body
    assert "### Risk: low" in body and "`hello.py` (A)" in body
    assert "Say hello on start." in body


def test_publishing_again_updates_the_same_pull_request(
    github: FakeGitHub, forge: Any, make_quantum: MakeQuantum
):
    quantum = make_quantum()
    pull = published(quantum, {"hello.py": "print('hi')\n"})
    pull_request_publish(pull_id=pull.pk)  # a redelivered task

    assert github.count("POST", PULLS) == 1
    assert len(github.open_pulls()) == 1


def test_changes_requested_reopen_the_quantum_and_the_fix_lands_on_the_same_pull_request(
    github: FakeGitHub, forge: Any, make_quantum: MakeQuantum, forge_settings: Any
):
    quantum = make_quantum()
    pull = published(quantum, {"hello.py": "print('hi')\n"})
    delivery = github.review(
        pull.number, "CHANGES_REQUESTED", "Greet by name, please.",
        comments=[("hello.py", 1, "use the user's name here")],
    )  # fmt: skip

    pull_request_sync(pull_id=pull.pk)

    review = ChangeReview.objects.get(pk=pull.change_id)
    assert review.status == ChangeStatus.REJECTED and review.decided_by == "github:octo-reviewer"
    quantum.refresh_from_db()
    assert quantum.status == QuantumStatus.OPEN
    reason = Comment.objects.filter(quantum=quantum).latest("pk").body
    assert "Greet by name, please." in reason and "hello.py:1: use the user's name here" in reason
    # The same delivery again (GitHub redelivers; the poll looks too): acted on once.
    pull_request_sync(pull_id=pull.pk)
    assert Comment.objects.filter(quantum=quantum, body__startswith="Reopened").count() == 1
    assert delivery["review"]["state"] == "changes_requested"

    fixed = published(quantum, {"hello.py": "import sys\nprint('hi', sys.argv[1])\n"})

    assert fixed.pk == pull.pk and fixed.number == pull.number
    assert len(github.open_pulls()) == 1 and github.count("POST", PULLS) == 1
    assert github.branch_sha(pull.branch) == ChangeReview.objects.get(pk=fixed.change_id).head_sha


def test_a_red_check_sends_the_change_back_with_its_output(
    github: FakeGitHub, forge: Any, make_quantum: MakeQuantum
):
    quantum = make_quantum()
    pull = published(quantum, {"hello.py": "print('hi')\n"})
    github.check(pull.head_sha, "tests", "failure", "test_greeting failed: expected 'hello'")
    github.review(pull.number, "APPROVED")

    pull_request_sync(pull_id=pull.pk)

    assert ChangeReview.objects.get(pk=pull.change_id).status == ChangeStatus.REJECTED
    reason = Comment.objects.filter(quantum=quantum).latest("pk").body
    assert "The check `tests` concluded failure" in reason
    assert "test_greeting failed: expected 'hello'" in reason


def test_a_green_approved_pull_request_is_merged_by_the_queue_through_the_forge(
    github: FakeGitHub, forge: Any, make_quantum: MakeQuantum
):
    quantum = make_quantum()
    pull = published(quantum, {"hello.py": "print('hi')\n"})
    github.check(pull.head_sha, "tests", "success")
    github.review(pull.number, "APPROVED", user="octo-lead")

    pull_request_sync(pull_id=pull.pk)

    review = ChangeReview.objects.get(pk=pull.change_id)
    assert review.status == ChangeStatus.QUEUED and review.decided_by == "github:octo-lead"
    report = merge_queue_run(repository_id=repository_default().pk)
    assert report.merged == [review.pk]
    review.refresh_from_db()
    assert pull.number is not None
    on_forge = github.pulls[pull.number]
    assert on_forge["merged"] and review.merge_sha == on_forge["merge_commit_sha"]
    assert github.branch_sha("main") == review.merge_sha
    assert PullRequest.objects.get(pk=pull.pk).state == PullState.MERGED


def test_a_base_that_requires_the_forges_merge_queue_gets_the_pull_request_handed_to_it(
    github: FakeGitHub, forge: Any, make_quantum: MakeQuantum
):
    github.merge_queue = True
    pull = published(make_quantum(), {"hello.py": "print('hi')\n"})
    github.check(pull.head_sha, "tests", "success")
    github.review(pull.number, "APPROVED")
    pull_request_sync(pull_id=pull.pk)

    report = merge_queue_run(repository_id=repository_default().pk)

    review = ChangeReview.objects.get(pk=pull.change_id)
    assert report.returned == [review.pk] and review.status == ChangeStatus.PENDING
    assert "merge queue" in review.comment
    assert pull.number is not None and github.pulls[pull.number]["auto_merge"]
    assert "in the forge's merge queue" in pull_request_sync(pull_id=pull.pk).outcome

    github.queue_merge(pull.number)
    pull_request_sync(pull_id=pull.pk)

    review.refresh_from_db()
    assert review.status == ChangeStatus.MERGED
    assert review.merge_sha == github.pulls[pull.number]["merge_commit_sha"]


def test_a_pull_request_waits_for_every_required_check(
    github: FakeGitHub, forge: Any, make_quantum: MakeQuantum
):
    forge_configure(
        repository_id=repository_default().pk, slug=github.slug, token_env="ACME_GITHUB_TOKEN",
        api_url=github.url, push_url=str(github.bare), required_checks=["tests", "lint"],
    )  # fmt: skip
    pull = published(make_quantum(), {"hello.py": "print('hi')\n"})
    github.review(pull.number, "APPROVED")
    github.check(pull.head_sha, "tests", "success")

    pull_request_sync(pull_id=pull.pk)
    assert ChangeReview.objects.get(pk=pull.change_id).status == ChangeStatus.PENDING

    github.check(pull.head_sha, "lint", "success")
    pull_request_sync(pull_id=pull.pk)
    assert ChangeReview.objects.get(pk=pull.change_id).status == ChangeStatus.QUEUED


def test_closed_on_the_forge_rejects_the_change_and_a_merge_there_closes_it_merged(
    github: FakeGitHub, forge: Any, make_quantum: MakeQuantum
):
    closed = published(make_quantum("One"), {"one.py": "1\n"})
    merged = published(make_quantum("Two"), {"two.py": "2\n"})
    github.close(closed.number)
    status, answer = github._merge(merged.number, None, "merge")
    assert status == 200

    pull_request_sync(pull_id=closed.pk)
    pull_request_sync(pull_id=merged.pk)

    rejected = ChangeReview.objects.get(pk=closed.change_id)
    assert rejected.status == ChangeStatus.REJECTED and "closed on the forge" in rejected.comment
    assert Quantum.objects.get(pk=rejected.quantum_id).status == QuantumStatus.CLOSED
    done = ChangeReview.objects.get(pk=merged.change_id)
    assert done.status == ChangeStatus.MERGED and done.merge_sha == answer["sha"]
    assert PullRequest.objects.get(pk=closed.pk).state == PullState.CLOSED


# --- crashes and the forge's refusals -----------------------------------------------------------


def test_a_crash_between_push_and_opening_opens_exactly_one_pull_request(
    github: FakeGitHub, forge: Any, make_quantum: MakeQuantum
):
    quantum = make_quantum()
    run = done_run(quantum, {"hello.py": "print('hi')\n"})
    review = change_review_create(quantum_run_id=run.pk)
    assert review is not None
    pull = PullRequest.objects.get(change=review)
    github.fail("POST", PULLS, 502, times=3)  # the client's retries spent: the task dies here

    with pytest.raises(ForgeUnavailable):
        pull_request_publish(pull_id=pull.pk)
    assert github.branch_sha(pull.branch) == review.head_sha and github.open_pulls() == []

    pull_request_publish(pull_id=pull.pk)  # the task again
    pull_request_publish(pull_id=pull.pk)  # and a duplicate of it

    assert len(github.open_pulls()) == 1
    assert PullRequest.objects.get(pk=pull.pk).state == PullState.OPEN


def test_an_opening_whose_answer_is_lost_opens_exactly_one_pull_request(
    github: FakeGitHub, forge: Any, make_quantum: MakeQuantum
):
    # GitHub opened it but answered 502: the client's retry is told it exists (422), and adopts.
    github.fail("POST", PULLS, 502, body=LOST)

    pull = published(make_quantum(), {"hello.py": "print('hi')\n"})

    assert pull.state == PullState.OPEN and github.count("POST", PULLS) == 2
    assert [p["number"] for p in github.open_pulls()] == [pull.number]


def test_a_crash_after_opening_before_recording_adopts_the_pull_request(
    github: FakeGitHub, forge: Any, make_quantum: MakeQuantum
):
    pull = published(make_quantum(), {"hello.py": "print('hi')\n"})
    PullRequest.objects.filter(pk=pull.pk).update(number=None, state=PullState.PUBLISHING)

    pull_request_publish(pull_id=pull.pk)

    assert github.count("POST", PULLS) == 1 and len(github.open_pulls()) == 1
    assert PullRequest.objects.get(pk=pull.pk).number == pull.number


def test_5xx_answers_are_retried_with_backoff(
    github: FakeGitHub, forge: Any, make_quantum: MakeQuantum
):
    github.fail("POST", PULLS, 503, times=2)
    pull = published(make_quantum(), {"hello.py": "print('hi')\n"})

    assert pull.state == PullState.OPEN
    assert github.count("POST", PULLS) == 3


def test_a_403_that_is_a_secondary_rate_limit_waits_and_passes(
    github: FakeGitHub, forge: Any, make_quantum: MakeQuantum
):
    limited = {"message": "You have exceeded a secondary rate limit. Please wait a few minutes."}
    github.fail("POST", PULLS, 403, body=limited, headers={"Retry-After": "1"})

    pull = published(make_quantum(), {"hello.py": "print('hi')\n"})

    assert pull.state == PullState.OPEN and github.count("POST", PULLS) == 2


def test_calls_are_paced_by_a_bucket_every_worker_shares(
    github: FakeGitHub, forge: Any, make_quantum: MakeQuantum, forge_settings: Any
):
    forge_settings.FORGES_RATE_CAPACITY = 3
    forge_settings.FORGES_RATE_PERIOD_S = 600.0
    forge_settings.FORGES_MAX_RATE_WAIT_S = 0.2
    run = done_run(make_quantum(), {"hello.py": "print('hi')\n"})
    review = change_review_create(quantum_run_id=run.pk)
    pull = PullRequest.objects.get(change=review)

    with pytest.raises(ForgeUnavailable, match="our rate limit is spent"):
        pull_request_publish(pull_id=pull.pk)
    assert len(github.requests) == 2  # the push took the first token; then two calls


def test_a_403_fails_the_pull_request_with_the_forges_words_and_no_retry(
    github: FakeGitHub, forge: Any, make_quantum: MakeQuantum
):
    github.fail("POST", PULLS, 403)
    pull = published(make_quantum(), {"hello.py": "print('hi')\n"})

    assert pull.state == PullState.FAILED
    assert "403" in pull.error and "Resource not accessible by integration" in pull.error
    assert github.count("POST", PULLS) == 1 and github.open_pulls() == []


def test_a_422_already_exists_adopts_the_open_pull_request(
    github: FakeGitHub, forge: Any, make_quantum: MakeQuantum
):
    run = done_run(make_quantum(), {"hello.py": "print('hi')\n"})
    pull = PullRequest.objects.get(change=change_review_create(quantum_run_id=run.pk))
    # A twin publisher opened it just after our look: our POST is answered 422.
    with github.lock:
        github._new_pull("opened by a twin", pull.branch, "main", "")
    github.fail("GET", PULLS, 200, body=[])

    pull_request_publish(pull_id=pull.pk)

    assert github.count("POST", PULLS) == 1 and len(github.open_pulls()) == 1
    assert PullRequest.objects.get(pk=pull.pk).state == PullState.OPEN


def test_a_422_refusal_fails_the_pull_request(
    github: FakeGitHub, forge: Any, make_quantum: MakeQuantum
):
    github.fail("POST", PULLS, 422)
    pull = published(make_quantum(), {"hello.py": "print('hi')\n"})

    assert pull.state == PullState.FAILED and "422" in pull.error
    assert "Validation Failed" in pull.error and github.open_pulls() == []


# --- secrets, deliveries, the poll --------------------------------------------------------------


def test_the_credential_is_named_not_stored_and_redacted(github: FakeGitHub, forge: Any, db: None):
    assert TOKEN not in json.dumps(list(type(forge).objects.values()), default=str)
    assert TOKEN not in redact(f"push with {TOKEN} failed")
    with pytest.raises(ForgeNotConfigured, match="_TOKEN or _KEY"):
        forge_configure(repository_id=forge.repository_id, slug="acme/widgets", token_env="GH")


def test_no_sandboxed_command_sees_the_credential(
    github: FakeGitHub, forge: Any, make_quantum: MakeQuantum
):
    quantum = make_quantum()
    tree = workspace_ensure(quantum_id=quantum.pk)

    result = sandbox_run(
        "env; tr '\\0' '\\n' < /proc/1/environ",
        workspace=tree,
        quantum_id=quantum.pk,
        timeout_s=20,
    )

    output = result.stdout
    assert "PATH=" in output  # it ran and printed its environment (pid 1's is not readable)
    assert "ACME_GITHUB_TOKEN" not in output and TOKEN not in output


@pytest.mark.django_db(transaction=True)
def test_a_review_delivered_to_the_webhook_sends_its_pull_requests_sync(
    github: FakeGitHub, make_quantum: MakeQuantum, forge_settings: Any, redis_client: redis.Redis
):
    forge_settings.HOOKS_GITHUB_SECRET = GITHUB_SECRET
    forge_configure(
        repository_id=repository_default().pk, slug=github.slug, token_env="ACME_GITHUB_TOKEN",
        api_url=github.url, push_url=str(github.bare),
    )  # fmt: skip
    pull = published(make_quantum(), {"hello.py": "print('hi')\n"})
    redis_client.delete("celery")

    answer = deliver("pull_request_review", github.review(pull.number, "CHANGES_REQUESTED", "No."))

    assert answer.status_code == 202, answer.content
    sent = [json.loads(m)["headers"] for m in redis_client.lrange("celery", 0, -1)]
    syncs = [h for h in sent if h["task"] == SYNC_TASK]
    assert [s["argsrepr"] for s in syncs] == [f"({pull.pk},)"]
    assert "looked at again" in json.loads(answer.content)["outcome"]
    pull_request_sync(pull_id=pull.pk)  # what the task does
    assert ChangeReview.objects.get(pk=pull.change_id).status == ChangeStatus.REJECTED


def test_the_poll_looks_at_open_pull_requests_when_no_webhook_is_configured(
    github: FakeGitHub,
    forge: Any,
    make_quantum: MakeQuantum,
    forge_settings: Any,
    django_capture_on_commit_callbacks: Any,
):
    forge_settings.HOOKS_GITHUB_SECRET = ""
    pull = published(make_quantum(), {"hello.py": "print('hi')\n"})
    assert pull_requests_due() == []  # read when published

    PullRequest.objects.filter(pk=pull.pk).update(synced_at=timezone.now() - timedelta(minutes=2))
    with django_capture_on_commit_callbacks() as callbacks:
        due = pull_requests_due()
    assert due == [pull.pk] and len(callbacks) == 1

    pull_request_sync(pull_id=pull.pk)
    assert pull_requests_due() == []  # looked at just now


def test_with_deliveries_the_poll_is_a_slower_safety_net(
    github: FakeGitHub, forge: Any, make_quantum: MakeQuantum, forge_settings: Any
):
    forge_settings.HOOKS_GITHUB_SECRET = GITHUB_SECRET
    pull = published(make_quantum(), {"hello.py": "print('hi')\n"})

    PullRequest.objects.filter(pk=pull.pk).update(synced_at=timezone.now() - timedelta(minutes=2))
    assert pull_requests_due() == []  # deliveries come: not polled every minute
    PullRequest.objects.filter(pk=pull.pk).update(synced_at=timezone.now() - timedelta(hours=1))
    assert pull_requests_due() == [pull.pk]


def test_the_command_sets_and_shows_a_repositorys_forge(github: FakeGitHub, db: None):
    from io import StringIO

    from django.core.management import call_command

    name = repository_default().name
    out = StringIO()
    call_command(
        "forges", "set", name, "--slug", "acme/widgets", "--token-env", "ACME_GITHUB_TOKEN",
        "--api-url", github.url, "--required-check", "tests", "--json", stdout=out,
    )  # fmt: skip
    shown = StringIO()
    call_command("forges", "show", name, "--json", stdout=shown)
    data = json.loads(shown.getvalue())
    assert (data["slug"], data["required_checks"]) == ("acme/widgets", ["tests"])
    assert TOKEN not in out.getvalue() + shown.getvalue()
