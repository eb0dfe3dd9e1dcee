"""Prompt caching: the providers' cache marks, the usage ledger's cache reads and writes and
their price, against fakes that cache by the APIs' rules."""

from __future__ import annotations

import itertools
from decimal import Decimal

import pytest

from psychonauts.models import Usage
from psychonauts.runtime.execute import agent_run_execute
from psychonauts.runtime.prompt import PROMPT_SECTIONS
from tests.fakes.anthropic_server import FakeReply, PromptCache, fake_anthropic_server
from tests.fakes.openai_server import FakeReply as OpenAIReply
from tests.fakes.openai_server import fake_openai_server

pytestmark = pytest.mark.django_db


@pytest.fixture
def fake_env(monkeypatch, settings):
    def point(base_url: str) -> None:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")

    settings.PSYCHONAUTS_PROVIDER_RETRIES = 1
    return point


def _looper(turns: int) -> list[FakeReply]:
    """`turns - 1` turns each reading a file, then a final answer."""
    reads = [FakeReply(tool_uses=[("list_dir", {"path": f"dir{n}"})]) for n in range(turns - 1)]
    return [*reads, FakeReply(text="Done.")]


def _marks(body: dict) -> int:
    blocks = list(body.get("tools") or [])
    blocks += body["system"] if isinstance(body.get("system"), list) else []
    for message in body["messages"]:
        if isinstance(message["content"], list):
            blocks += message["content"]
    return sum(1 for b in blocks if "cache_control" in b)


def test_an_agent_reads_each_turn_what_the_last_one_wrote(repo, make_run, fake_env):
    run = make_run("coder", provider="anthropic")
    with fake_anthropic_server(_looper(12), cache=PromptCache()) as fake:
        fake_env(fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    assert all(_marks(body) <= 4 for body in fake.requests)
    usages = fake.usages
    assert usages[0]["cache_read_input_tokens"] == 0
    assert usages[0]["cache_creation_input_tokens"] > 1024  # the tools and the system prompt
    for before, after in itertools.pairwise(usages):
        # Everything the previous turn read or wrote is read now.
        assert after["cache_read_input_tokens"] == (
            before["cache_read_input_tokens"] + before["cache_creation_input_tokens"]
        )
    rows = list(Usage.objects.filter(agent_run=run).order_by("pk"))
    read = sum(u.cache_read_tokens for u in rows)
    whole = sum(u.tokens_in + u.cache_read_tokens + u.cache_write_tokens for u in rows)
    assert read / whole > 0.8


def test_the_ledger_prices_cache_reads_and_writes(repo, make_run, fake_env):
    run = make_run("coder", provider="anthropic")
    with fake_anthropic_server(_looper(2), cache=PromptCache()) as fake:
        fake_env(fake.base_url)
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    rows = list(Usage.objects.filter(agent_run=run).order_by("pk"))
    for usage, reported in zip(rows, fake.usages, strict=True):
        assert usage.tokens_in == reported["input_tokens"]
        assert usage.cache_read_tokens == reported["cache_read_input_tokens"]
        assert usage.cache_write_tokens == reported["cache_creation_input_tokens"]
        # claude-sonnet-4-6: $3 in, $15 out per million; a read 0.1x, a 5-minute write 1.25x.
        expected = (
            usage.tokens_in * 3
            + usage.cache_read_tokens * 0.3
            + usage.cache_write_tokens * 3.75
            + usage.tokens_out * 15
        ) / 1e6
        assert float(usage.cost_usd) == pytest.approx(expected, abs=1e-6)
    assert rows[1].cache_read_tokens > 0


def test_agents_of_one_role_share_their_cached_prefix(repo, make_run, make_quantum, fake_env):
    """What differs between agents of one role (their quantum, the playbook rules and skill
    injected for it) comes after the prefix they share: the second reads the tools and the
    system prompt the first wrote."""

    def rules(run):
        return f"## Playbook rules\n- rule for quantum {run.quantum_id}"

    first = make_run("coder", provider="anthropic", quantum=make_quantum(title="one"))
    second = make_run("coder", provider="anthropic", quantum=make_quantum(title="two"))
    with (
        PROMPT_SECTIONS.replaced(*PROMPT_SECTIONS, rules),
        fake_anthropic_server(_looper(1), cache=PromptCache()) as fake,
    ):
        fake_env(fake.base_url)
        assert agent_run_execute(agent_run_id=first.pk).status == "done"
        fake._replies = _looper(1)
        assert agent_run_execute(agent_run_id=second.pk).status == "done"

    assert fake.requests[0]["system"] == fake.requests[1]["system"]
    written, read = fake.usages[0]["cache_creation_input_tokens"], fake.usages[1]
    assert read["cache_read_input_tokens"] > 1024
    assert read["cache_read_input_tokens"] < written  # not the first agent's own messages


def test_without_caching_nothing_is_marked(repo, make_run, fake_env, settings):
    settings.PSYCHONAUTS_PROMPT_CACHE = False
    run = make_run("coder", provider="anthropic")
    with fake_anthropic_server(_looper(2), cache=PromptCache()) as fake:
        fake_env(fake.base_url)
        assert agent_run_execute(agent_run_id=run.pk).status == "done"

    assert [u["cache_read_input_tokens"] for u in fake.usages] == [0, 0]
    assert all(_marks(body) == 0 for body in fake.requests)


def test_openai_cached_tokens_are_recorded_as_cache_reads(repo, make_run, monkeypatch, settings):
    settings.PSYCHONAUTS_PRICES = {**settings.PSYCHONAUTS_PRICES, "gpt-test": (2.0, 8.0)}
    run = make_run("planner", provider="openai", model="gpt-test")
    reply = OpenAIReply(text="OK", tokens_in=1000, tokens_out=10, cached_tokens=800)
    with fake_openai_server([reply]) as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        assert agent_run_execute(agent_run_id=run.pk).status == "done"

    usage = Usage.objects.get(agent_run=run)
    assert (usage.tokens_in, usage.cache_read_tokens) == (200, 800)
    assert usage.cost_usd == Decimal(str(round((200 * 2 + 800 * 0.2 + 10 * 8) / 1e6, 6)))


# --- the fake's rules, which the figures above rest on ------------------------------------------


def _body(*messages: str, marks: tuple[int, ...] = (), ttl: str = "") -> dict:
    mark = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
    content = [
        {
            "role": "user" if n % 2 == 0 else "assistant",
            "content": [
                {"type": "text", "text": t, **({"cache_control": mark} if n in marks else {})}
            ],
        }
        for n, t in enumerate(messages)
    ]
    return {"model": "claude-sonnet-4-6", "system": "S" * 4000, "messages": content}


def test_the_fake_caches_a_marked_prefix_for_five_minutes():
    cache = PromptCache()
    first = cache.usage(_body("hello", marks=(0,)))
    assert first["cache_read_input_tokens"] == 0
    assert first["cache_creation_input_tokens"] > 1000
    again = cache.usage(_body("hello", "hi", "more", marks=(2,)))
    assert again["cache_read_input_tokens"] == first["cache_creation_input_tokens"]
    cache.advance(301)
    assert cache.usage(_body("hello", marks=(0,)))["cache_read_input_tokens"] == 0


def test_the_fake_keeps_an_hour_long_entry_and_refuses_what_the_api_refuses():
    from tests.fakes.anthropic_server import CacheRefused

    cache = PromptCache()
    written = cache.usage(_body("hello", marks=(0,), ttl="1h"))
    assert written["cache_creation"]["ephemeral_1h_input_tokens"] > 1000
    cache.advance(3000)
    assert cache.usage(_body("hello", marks=(0,)))["cache_read_input_tokens"] > 1000
    with pytest.raises(CacheRefused):
        cache.usage(_body("a", "b", "c", "d", "e", marks=(0, 1, 2, 3, 4)))
    short = PromptCache().usage({"model": "m", "messages": [_body("x", marks=(0,))["messages"][0]]})
    assert short["cache_creation_input_tokens"] == 0  # under the minimum cacheable length


def _waited(role: str, agent_run, times: int, gap_s: float) -> None:
    """History: `times` calls of an agent run of `role`, each followed by a wait of `gap_s`."""
    from datetime import timedelta

    from django.utils import timezone

    start = timezone.now() - timedelta(seconds=gap_s * (times + 1))
    for n in range(times + 1):
        usage = Usage.objects.create(agent_run=agent_run, provider="anthropic", model="m")
        Usage.objects.filter(pk=usage.pk).update(created_at=start + timedelta(seconds=gap_s * n))


@pytest.mark.parametrize(("gap_s", "long"), [(20 * 60, True), (30, False)])
def test_an_hour_long_cache_is_written_when_agents_of_the_role_are_measured_waiting_long(
    repo, make_run, fake_env, gap_s, long
):
    from psychonauts.routing.cache_ttl import long_wait_forget

    long_wait_forget()
    _waited("coder", make_run("coder"), times=4, gap_s=gap_s)
    run = make_run("coder", provider="anthropic")
    with fake_anthropic_server(_looper(2), cache=PromptCache()) as fake:
        fake_env(fake.base_url)
        assert agent_run_execute(agent_run_id=run.pk).status == "done"
    long_wait_forget()

    ttls = {b["cache_control"].get("ttl", "5m") for b in fake.requests[0]["system"]}
    assert ttls == ({"1h"} if long else {"5m"})
    first = Usage.objects.filter(agent_run=run).order_by("pk").first()
    assert first is not None
    if long:
        # Written for an hour: priced at twice the input price.
        assert first.cache_write_long_tokens > 1024 and first.cache_write_tokens == 0
        expected = (
            first.tokens_in * 3 + first.cache_write_long_tokens * 6 + first.tokens_out * 15
        ) / 1e6
        assert float(first.cost_usd) == pytest.approx(expected, abs=1e-6)
    else:
        assert first.cache_write_long_tokens == 0 and first.cache_write_tokens > 1024
