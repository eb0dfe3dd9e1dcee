"""A wave run by a real worker on the scripted provider, on a repository that publishes to a fake
GitHub: each done run's review becomes a pull request (the review and publish tasks on the
worker), and a review delivered to /hooks/github sends the change back through the worker."""

from __future__ import annotations

from typing import Any

import pytest

from bursts.services import wave_start
from forges.models import PullRequest, PullState
from forges.services import forge_configure
from psychonauts.workspaces.repository import branch_for
from quanta.models import QuantumStatus
from repos.services import repository_default
from tests.bursts.conftest import pipeline, wait_wave
from tests.fakes.github_server import FakeGitHub
from tests.forges.conftest import MakeQuantum
from tests.hooks.conftest import GITHUB_SECRET, deliver
from tests.polling import wait_for
from tether.models import ChangeReview, ChangeStatus

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_waves_changes_become_pull_requests_and_a_review_reopens_one(
    github: FakeGitHub, tether_worker: Any, make_quantum: MakeQuantum, forge_settings: Any
):
    forge_settings.HOOKS_GITHUB_SECRET = GITHUB_SECRET
    forge_configure(
        repository_id=repository_default().pk, slug=github.slug, token_env="ACME_GITHUB_TOKEN",
        api_url=github.url, push_url=str(github.bare),
    )  # fmt: skip
    pipeline("solo", ("sequential", ["coder"]), labels=["solo"])
    quanta = [make_quantum(f"Write note {n}", labels=["solo"]) for n in range(2)]

    assert wait_wave(wave_start(labels=["solo"]).pk).status == "done"

    opened = wait_for(
        lambda: (
            len(github.open_pulls()) == 2
            and PullRequest.objects.filter(state=PullState.OPEN).count() == 2
        ),
        timeout=60,
        what="two pull requests opened by the worker",
    )
    assert opened
    assert sorted(p["head"]["ref"] for p in github.open_pulls()) == sorted(
        branch_for(q.pk) for q in quanta
    )
    pull = PullRequest.objects.get(branch=branch_for(quanta[0].pk))
    assert pull.number is not None

    answer = deliver(
        "pull_request_review",
        github.review(pull.number, "CHANGES_REQUESTED", "Say why in the note."),
    )
    assert answer.status_code == 202, answer.content

    wait_for(
        lambda: ChangeReview.objects.get(pk=pull.change_id).status == ChangeStatus.REJECTED,
        timeout=30,
        what="the worker's sync to send the change back",
    )
    quanta[0].refresh_from_db()
    assert quanta[0].status == QuantumStatus.OPEN
