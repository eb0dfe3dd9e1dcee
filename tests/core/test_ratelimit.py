"""The Redis token bucket: a burst up to the capacity, refusal with the wait, refill over time,
separate buckets per key, and one atomic take under concurrent callers."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from core.ratelimit import InvalidRate, Rate, rate_reset, rate_take


def test_it_allows_a_burst_up_to_the_capacity_then_refuses_with_the_wait(
    redis_client: redis.Redis,
) -> None:
    rate = Rate(capacity=5, period_s=10)
    decisions = [rate_take(key="t:burst", rate=rate) for _ in range(6)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False]
    assert [d.remaining for d in decisions[:5]] == [4, 3, 2, 1, 0]
    refused = decisions[-1]
    # One token comes back every 2 s.
    assert 1.5 < refused.retry_after_s <= 2.0
    assert refused.retry_after_header == "2"


def test_it_refills_at_the_rate(redis_client: redis.Redis) -> None:
    rate = Rate(capacity=2, period_s=0.4)  # a token every 0.2 s
    assert rate_take(key="t:refill", rate=rate).allowed
    assert rate_take(key="t:refill", rate=rate).allowed
    assert not rate_take(key="t:refill", rate=rate).allowed
    time.sleep(0.25)
    assert rate_take(key="t:refill", rate=rate).allowed
    assert not rate_take(key="t:refill", rate=rate).allowed


def test_each_key_has_its_own_bucket_and_a_reset_fills_it(redis_client: redis.Redis) -> None:
    rate = Rate(capacity=1, period_s=60)
    assert rate_take(key="t:a", rate=rate).allowed
    assert not rate_take(key="t:a", rate=rate).allowed
    assert rate_take(key="t:b", rate=rate).allowed
    rate_reset(key="t:a")
    assert rate_take(key="t:a", rate=rate).allowed


def test_concurrent_takers_never_spend_more_than_the_capacity(redis_client: redis.Redis) -> None:
    rate = Rate(capacity=50, period_s=3600)
    with ThreadPoolExecutor(max_workers=8) as pool:
        allowed = list(pool.map(lambda _: rate_take(key="t:race", rate=rate).allowed, range(200)))
    assert allowed.count(True) == 50


def test_a_bucket_expires_once_it_would_be_full(redis_client: redis.Redis) -> None:
    rate_take(key="t:ttl", rate=Rate(capacity=10, period_s=5))
    ttl_ms = redis_client.pttl("ratelimit:t:ttl")
    assert 5000 < ttl_ms <= 6000


def test_it_refuses_a_rate_that_cannot_work() -> None:
    with pytest.raises(InvalidRate):
        Rate(capacity=0, period_s=1)
    with pytest.raises(InvalidRate):
        Rate(capacity=1, period_s=0)
    with pytest.raises(InvalidRate):
        rate_take(key="t:cost", rate=Rate(capacity=2, period_s=1), cost=3)
