"""What the endpoint registry and the openai provider cost per run and per model call.

Prints:
- routing: the time to route one run (`_route`) with an empty registry (PSYCHONAUTS_MODELS) and
  with a registry of 12 endpoints (4 per tier, one tier down): p50 / p95;
- a model call through the openai provider against the local fake OpenAI-compatible server (a
  2,000-character answer in 5-character chunks and a tool call whose arguments come 3 characters
  at a time): CPU per call, bare and through the endpoint's slot (the Redis semaphore), and the
  wall time of the slot's acquire and release;
- the in-flight limit: 32 calls from 8 threads on an endpoint limited to 4: the most the server
  saw at once.

    python bench/endpoints.py [--routes 2000] [--calls 200] [--json]       (needs `make services`)

Uses a database of its own (annihilation_bench_endpoints, migrated and emptied).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))
from bench._setup import django_bench_db, pct  # noqa: E402

os.environ["ANNIHILATION_PROVIDER"] = ""
django_bench_db("annihilation_bench_endpoints")

from django.conf import settings  # noqa: E402

from core.redis import get_redis  # noqa: E402
from psychonauts.models import Role  # noqa: E402
from psychonauts.roles import roles_sync_defaults  # noqa: E402
from psychonauts.routing.endpoints import (  # noqa: E402
    endpoint_add,
    endpoint_mark_down,
    endpoint_provider,
    registry_snapshot,
)
from psychonauts.routing.providers.base import ProviderRequest, RunInfo  # noqa: E402
from psychonauts.routing.providers.openai import OpenAIProvider  # noqa: E402
from psychonauts.routing.semaphore import slot_held  # noqa: E402
from psychonauts.runtime.execute import _route  # noqa: E402
from psychonauts.runtime.runs import agent_run_create  # noqa: E402
from quanta.services import quantum_create  # noqa: E402
from tests.fakes.openai_server import FakeReply, fake_openai_server  # noqa: E402

TEXT = "".join(f"line {n:04d} of the answer, padded out. " for n in range(50))[:2000]


def route_times(count: int) -> list[float]:
    roles_sync_defaults()
    quantum = quantum_create(title="Add a greeting", complexity="standard")
    run = agent_run_create(quantum_id=quantum.pk, role="planner", provider="openai")
    run.quantum  # noqa: B018 — loaded once, as agent_run_execute's read does
    role = Role.objects.get(name="planner")
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        _route(run, role)
        samples.append(time.perf_counter() - started)
    return samples


def request(n: int) -> ProviderRequest:
    info = RunInfo(agent_run_id=n, agent_id=f"a{n}", role="coder", attempt=1, quantum_id=1)
    return ProviderRequest(
        model="llama3",
        system="You are a coder.",
        messages=[{"role": "user", "content": "Write the file."}],
        tools=[{"name": "write_file", "description": "d", "input_schema": {"type": "object"}}],
        max_tokens=1024,
        run=info,
    )


def cpu_per_call(provider: object, calls: int) -> float:
    complete = provider.complete  # type: ignore[attr-defined]
    started = time.process_time()
    for n in range(calls):
        complete(request(n), lambda _text: None)
    return (time.process_time() - started) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--routes", type=int, default=2000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    settings.ENDPOINTS_CACHE_S = 5.0
    get_redis().flushdb()
    figures: dict[str, float | int] = {}

    empty = route_times(args.routes)
    figures["route_empty_registry_p50_us"] = pct(empty, 50) * 1e6
    figures["route_empty_registry_p95_us"] = pct(empty, 95) * 1e6

    for tier in ("trivial", "standard", "complex"):
        for n in range(4):
            endpoint_add(
                name=f"{tier}-{n}", model=f"model-{tier}", tier=tier,
                base_url=f"http://gpu-{n}.example:8000/v1", max_concurrency=8,
            )  # fmt: skip
    endpoint_mark_down(provider="openai", model="standard-0", reason="bench", ttl_s=600)
    registry = route_times(args.routes)
    figures["route_registry_12_p50_us"] = pct(registry, 50) * 1e6
    figures["route_registry_12_p95_us"] = pct(registry, 95) * 1e6

    reply = FakeReply(
        text=TEXT, tool_calls=[("write_file", {"path": "a.py", "content": TEXT[:600]})]
    )
    with fake_openai_server(lambda body: reply, models=["llama3"]) as fake:
        conf = next(c for c in registry_snapshot() if c.name == "standard-1")
        conf = type(conf)(**{**conf.__dict__, "base_url": fake.base_url, "model": "llama3"})
        bare = OpenAIProvider(base_url=fake.base_url, api_key="k", timeout_s=30)
        limited = endpoint_provider(conf)
        cpu_per_call(bare, 5)  # connections and imports warmed
        figures["call_cpu_bare_ms"] = cpu_per_call(bare, args.calls) * 1000
        figures["call_cpu_with_slot_ms"] = cpu_per_call(limited, args.calls) * 1000
        slot_wall = []
        for n in range(args.calls):
            holder = f"bench:{n}"
            started = time.perf_counter()
            with slot_held(holder, limit=4, key=conf.slots_key):
                pass
            slot_wall.append(time.perf_counter() - started)
        figures["slot_acquire_release_p50_us"] = pct(slot_wall, 50) * 1e6
        figures["slot_acquire_release_p95_us"] = pct(slot_wall, 95) * 1e6

    slow = FakeReply(text="ok", delay_s=0.05)
    with fake_openai_server(lambda body: slow) as fake:
        conf = type(conf)(**{**conf.__dict__, "base_url": fake.base_url, "max_concurrency": 4})
        limited = endpoint_provider(conf)

        def caller(first: int) -> None:
            for n in range(first, first + 4):
                limited.complete(request(n), lambda _text: None)

        threads = [threading.Thread(target=caller, args=(i * 4,)) for i in range(8)]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        figures["limited_calls"] = len(fake.requests)
        figures["limited_max_in_flight"] = fake.max_in_flight
        figures["limited_wall_s"] = time.perf_counter() - started

    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(
        f"routing, empty registry:   p50 {figures['route_empty_registry_p50_us']:.0f} us, "
        f"p95 {figures['route_empty_registry_p95_us']:.0f} us"
    )
    print(
        f"routing, 12 endpoints:     p50 {figures['route_registry_12_p50_us']:.0f} us, "
        f"p95 {figures['route_registry_12_p95_us']:.0f} us"
    )
    print(
        f"openai call CPU:           {figures['call_cpu_bare_ms']:.2f} ms bare, "
        f"{figures['call_cpu_with_slot_ms']:.2f} ms through the endpoint's slot"
    )
    print(
        f"slot acquire + release:    p50 {figures['slot_acquire_release_p50_us']:.0f} us, "
        f"p95 {figures['slot_acquire_release_p95_us']:.0f} us"
    )
    print(f"in-flight limit 4:         {figures['limited_calls']} calls, at most "
          f"{figures['limited_max_in_flight']} at once, {figures['limited_wall_s']:.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
