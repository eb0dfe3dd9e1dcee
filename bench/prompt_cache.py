"""Prompt caching: the share of input tokens read from cache, and the input cost against the same
run without caching.

Two runs through the anthropic provider (the real request building, cache marks and usage
parsing) against the fake Messages API that caches by the API's rules (breakpoints, prefix
match, 20-block lookback, minimum cacheable length, TTL; tests/fakes/anthropic_server.py):

- one coder agent over 30 turns: the coder role's system prompt and tools, a quantum's prompt
  with playbook rules, each turn a tool call whose result (~1,500 characters) is sent back;
- a wave of 20 coder agents at once, 10 turns each, each on its own quantum.

Each is run with the cache marks and without them (ANNIHILATION_PROMPT_CACHE off); input cost
at Claude Sonnet's price (a read 0.1x, a 5-minute write 1.25x). Targets: >= 90% of the single
agent's input read from cache, >= 80% of the wave's.

    python bench/prompt_cache.py [--turns 30] [--agents 20] [--wave-turns 10]
Needs no database or Redis: the provider is called directly.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "annihilation.settings")
os.environ["ANTHROPIC_API_KEY"] = "bench"

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402

from psychonauts.roles import role_parse  # noqa: E402
from psychonauts.routing.providers.anthropic import AnthropicProvider, shared_client  # noqa: E402
from psychonauts.routing.providers.base import Message, ProviderRequest, RunInfo  # noqa: E402
from psychonauts.runtime.budget import (  # noqa: E402
    CACHE_READ_FACTOR,
    CACHE_WRITE_FACTOR,
    CACHE_WRITE_LONG_FACTOR,
)
from psychonauts.runtime.tools import tools_for  # noqa: E402
from tests.fakes.anthropic_server import FakeReply, PromptCache, fake_anthropic_server  # noqa: E402

MODEL = "claude-sonnet-4-6"


@dataclass
class Tally:
    plain: int = 0  # input tokens neither read from nor written to the cache
    read: int = 0
    write: int = 0
    write_long: int = 0

    @property
    def whole(self) -> int:
        return self.plain + self.read + self.write + self.write_long

    def input_usd(self) -> float:
        price_in = settings.PSYCHONAUTS_PRICES[MODEL][0]
        weighted = (
            self.plain
            + self.read * CACHE_READ_FACTOR
            + self.write * CACHE_WRITE_FACTOR
            + self.write_long * CACHE_WRITE_LONG_FACTOR
        )
        return weighted * price_in / 1e6


def _quantum_prompt(n: int) -> str:
    body = " ".join(
        f"Step {i}: change module_{n}_{i} so that it handles case {i}." for i in range(30)
    )
    rules = "\n".join(f"- rule {i}: prefer small functions in module_{n}" for i in range(8))
    return (
        f"# Quantum #{n}: make module {n} handle every case\nkind: task; complexity: standard\n\n"
        f"{body}\n\n## Acceptance criteria\nThe tests of module {n} pass.\n\n"
        f"## Playbook rules\n{rules}\n\nYou are agent {n}_s0_coder (attempt 1, role coder)."
    )


def _file(n: int, turn: int) -> str:
    return "\n".join(f"def f_{n}_{turn}_{i}(x):\n    return x + {i}" for i in range(45))


def agent(n: int, turns: int, lock: threading.Lock, tally: Tally) -> None:
    coder = role_parse(Path(settings.PSYCHONAUTS_ROLE_DIR) / "coder.yaml")
    system = (
        f"{coder['system_prompt']}\n\nYou work in a git workspace; use paths relative to its root."
    )
    tools = [t.spec() for t in tools_for(list(coder["allowed_tools"]))]  # type: ignore[call-overload]
    messages: list[Message] = [{"role": "user", "content": _quantum_prompt(n)}]
    provider = AnthropicProvider(client=shared_client())
    for turn in range(turns):
        request = ProviderRequest(
            model=MODEL,
            system=system,
            messages=messages,
            tools=tools,
            max_tokens=4096,
            run=RunInfo(agent_run_id=n, agent_id=f"{n}", role="coder", attempt=1, quantum_id=n),
        )
        response = provider.complete(request, lambda _: None)
        with lock:
            tally.plain += response.tokens_in
            tally.read += response.cache_read
            tally.write += response.cache_write
            tally.write_long += response.cache_write_long
        messages.append({"role": "assistant", "content": list(response.content)})
        results = [
            {"type": "tool_result", "tool_use_id": use["id"], "content": _file(n, turn)}
            for use in response.tool_uses
        ]
        if not results:
            break
        messages.append({"role": "user", "content": results})


def reply(body: dict[str, Any]) -> FakeReply:
    return FakeReply(
        text="Reading.", tool_uses=[("read_file", {"path": "module.py"})], tokens_out=40
    )


def run(agents: int, turns: int, cached: bool) -> Tally:
    settings.PSYCHONAUTS_PROMPT_CACHE = cached
    tally, lock = Tally(), threading.Lock()
    with fake_anthropic_server(reply, cache=PromptCache()) as fake:
        os.environ["ANTHROPIC_BASE_URL"] = fake.base_url
        threads = [
            threading.Thread(target=agent, args=(n, turns, lock, tally)) for n in range(agents)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return tally


def report(name: str, agents: int, turns: int, target: float) -> bool:
    cached, plain = run(agents, turns, True), run(agents, turns, False)
    share = cached.read / cached.whole
    print(f"{name}: {agents} agent(s) x {turns} turns, {cached.whole:,} input tokens")
    print(
        f"  read from cache {share:.1%} (target >= {target:.0%}); "
        f"written {cached.write + cached.write_long:,}, uncached {cached.plain:,}"
    )
    print(
        f"  input cost ${cached.input_usd():.4f} with caching, ${plain.input_usd():.4f} without "
        f"({cached.input_usd() / plain.input_usd():.1%})"
    )
    return share >= target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--wave-turns", type=int, default=10)
    args = parser.parse_args()
    ok = report("single agent", 1, args.turns, 0.90)
    ok = report("wave of one role", args.agents, args.wave_turns, 0.80) and ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
