"""Endpoint health in the real Redis: failures in a row, resets, marking down and its expiry."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

from psychonauts.routing import endpoints
from psychonauts.routing.endpoints import (
    endpoint_down,
    endpoint_failure,
    endpoint_mark_down,
    endpoint_success,
    endpoints_down,
    endpoints_failing,
)


@pytest.fixture(autouse=True)
def clean(redis_client, settings):
    settings.AUTOPILOT_ENDPOINT_FAILURES = 3
    endpoints._reset_at.clear()
    yield
    endpoints._reset_at.clear()


def test_it_lists_an_endpoint_once_its_failures_in_a_row_reach_the_setting():
    for _ in range(2):
        endpoint_failure("anthropic", "claude-opus-4-6")
    endpoint_failure("anthropic", "claude-sonnet-4-6")
    assert endpoints_failing() == []

    assert endpoint_failure("anthropic", "claude-opus-4-6") == 3

    [health] = endpoints_failing()
    assert (health.provider, health.model, health.failures, health.down_until) == (
        "anthropic", "claude-opus-4-6", 3, None,
    )  # fmt: skip


def test_a_success_resets_the_count_and_a_second_within_the_interval_costs_nothing(
    redis_client,
):
    for _ in range(3):
        endpoint_failure("anthropic", "m")
    endpoint_success("anthropic", "m")
    assert endpoints_failing() == []

    redis_client.hset(endpoints.FAILURES_KEY, "anthropic|m", 5)  # another process's failures
    endpoint_success("anthropic", "m")  # within the interval: not sent
    assert [h.failures for h in endpoints_failing()] == [5]

    endpoint_failure("anthropic", "m")  # a failure seen here: the next success is sent
    endpoint_success("anthropic", "m")
    assert endpoints_failing() == []


def test_marking_down_expires_by_itself_and_starts_the_count_again():
    for _ in range(3):
        endpoint_failure("anthropic", "m")

    endpoint_mark_down(provider="anthropic", model="m", reason="3 failures in a row", ttl_s=0.3)

    assert endpoint_down("anthropic", "m") and not endpoint_down("anthropic", "other")
    assert endpoints_down([("anthropic", "m"), ("anthropic", "other")]) == {("anthropic", "m")}
    assert endpoints_failing() == []  # a fresh start once it is back
    time.sleep(0.4)
    assert not endpoint_down("anthropic", "m")


def test_a_failing_endpoint_that_is_down_says_until_when_and_why():
    endpoint_mark_down(provider="anthropic", model="m", reason="overloaded", ttl_s=60)
    for _ in range(3):  # runs that named the model kept failing meanwhile
        endpoint_failure("anthropic", "m")

    [health] = endpoints_failing()

    assert health.reason == "overloaded"
    assert health.down_until is not None
    assert 55 < (health.down_until - timezone.now()).total_seconds() <= 60


def test_models_with_a_bar_in_their_name_keep_it():
    for _ in range(3):
        endpoint_failure("gateway", "org|model-a")

    [health] = endpoints_failing()

    assert (health.provider, health.model) == ("gateway", "org|model-a")
