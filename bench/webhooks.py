"""Webhook ingest: signed GitHub deliveries posted to daphne's /hooks/github at a fixed rate.

Client threads send a mix of deliveries (pings, pushes to another branch, issues without the
label, and labelled issues that become quanta) on a schedule of `--rate` per second for
`--seconds`, over keep-alive connections. Printed: the rate achieved, response latency
p50 / p95 / p99 (from when each was due, so a server that falls behind shows its backlog), and
loss: every delivery answered 202 must be a row (and each labelled issue one quantum); target
500 deliveries per second without loss. Then the same mix through the service alone (no HTTP,
no middleware) from 8 threads, to tell the hooks code's cost from the web stack's.

    .venv/bin/python bench/webhooks.py [--rate 500] [--seconds 10] [--json]   (needs `make services`)
Uses a database of its own (annihilation_bench_webhooks, emptied first).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import http.client
import json
import os
import sys
import threading
import time
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))
os.environ.setdefault("DEBUG", "true")
SECRET = "bench-webhook-secret-Q1w2E3r4"
os.environ["ANNIHILATION_GITHUB_WEBHOOK_SECRET"] = SECRET
os.environ["ANNIHILATION_GITHUB_BASE_BRANCH"] = "main"
os.environ.setdefault("LOG_LEVEL", "WARNING")

from bench._setup import daphne_serving, django_bench_db, pct  # noqa: E402

django_bench_db("annihilation_bench_webhooks")  # sets DATABASE_URL for daphne too

from hooks.models import GithubDelivery  # noqa: E402
from quanta.models import Quantum  # noqa: E402

LABELLED_EVERY = 20  # one delivery in 20 is a labelled issue (a new quantum)


def delivery(i: int) -> tuple[str, bytes]:
    repo = {"full_name": "acme/widgets"}
    if i % LABELLED_EVERY == 0:
        labels = [{"name": "annihilation"}]
        issue = {"number": i, "title": f"Bench issue {i}", "body": "b", "labels": labels}
        return "issues", json.dumps(
            {"action": "opened", "issue": issue, "repository": repo}
        ).encode()
    kind = i % 4
    if kind == 0:
        return "ping", json.dumps({"zen": "Design for failure.", "hook_id": i}).encode()
    if kind == 1:
        return "push", json.dumps({"ref": f"refs/heads/feature-{i}", "repository": repo}).encode()
    issue = {"number": i, "title": f"Bench issue {i}", "body": "b", "labels": [{"name": "bug"}]}
    return "issues", json.dumps({"action": "opened", "issue": issue, "repository": repo}).encode()


def send_all(
    port: int, indexes: range, start: float, rate: float, out: list[tuple[int, float]]
) -> None:
    """Send the deliveries `indexes` (of the global schedule, i at start + i / rate)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for i in indexes:
        due = start + i / rate
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        event, body = delivery(i)
        headers = {
            "Content-Type": "application/json",
            "X-GitHub-Event": event,
            "X-GitHub-Delivery": f"bench-{i}",
            "X-Hub-Signature-256": "sha256="
            + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest(),
        }
        sent = time.monotonic()
        try:
            conn.request("POST", "/hooks/github", body, headers)
            response = conn.getresponse()
            response.read()
            status = response.status
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            status = 0
        # Latency from when it was due: a sender that fell behind counts its wait.
        out.append((status, time.monotonic() - min(sent, max(due, start))))
    conn.close()


def run(rate: float, seconds: float, threads: int) -> dict[str, object]:
    with daphne_serving() as port:
        total = int(rate * seconds)
        results: list[list[tuple[int, float]]] = [[] for _ in range(threads)]
        start = time.monotonic() + 0.2
        workers = [
            threading.Thread(
                target=send_all, args=(port, range(t, total, threads), start, rate, results[t])
            )
            for t in range(threads)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed = time.monotonic() - start
    flat = [r for rs in results for r in rs]
    accepted = sum(1 for status, _ in flat if status == 202)
    latencies = [lat for _, lat in flat]
    rows = GithubDelivery.objects.count()
    labelled = len(range(0, total, LABELLED_EVERY))
    return {
        "deliveries": total,
        "target_per_s": rate,
        "achieved_per_s": round(total / elapsed, 1),
        "accepted": accepted,
        "refused_or_failed": total - accepted,
        "rows": rows,
        "lost": accepted - rows,
        "quanta": Quantum.objects.count(),
        "quanta_expected": labelled,
        "p50_ms": round(pct(latencies, 50) * 1000, 2),
        "p95_ms": round(pct(latencies, 95) * 1000, 2),
        "p99_ms": round(pct(latencies, 99) * 1000, 2),
    }


def service_only(count: int, threads: int) -> float:
    """Deliveries per second through the service alone (no HTTP, no middleware), from
    `threads` threads: what the hooks code and Postgres sustain on this machine."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connections

    from hooks.services.github import github_receive

    def one(i: int) -> None:
        event, body = delivery(i)
        signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        try:
            github_receive(body=body, signature=signature, event=event, delivery_id=f"svc-{i}")
        finally:
            connections.close_all()

    offset = 10_000_000  # issue numbers apart from the HTTP run's
    start = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(offset, offset + count)))
    return count / (time.monotonic() - start)


def outbox(events: int) -> dict[str, object]:
    """The outbox over `events` events of the stream, one in 50 a webhook event, for two
    endpoints: scan passes until the cursor reaches the end; events and deliveries per second.
    The deliveries' tasks are not sent (no worker here; the sends are not what is timed)."""
    from core.events import publish_many
    from core.models import Event
    from hooks.models import OutboxCursor, WebhookDelivery, WebhookEndpoint
    from hooks.services import outgoing
    from hooks.services.endpoints import endpoint_save

    for name in ("a", "b"):
        endpoint_save(endpoint=WebhookEndpoint(
            name=f"bench-{name}", url="http://127.0.0.1:9/", secret_env="BENCH_HOOK_SECRET",
            events=["wave.completed"]))  # fmt: skip
    outgoing.outbox_scan()  # the cursor starts at the end of the stream
    chunk = 1000
    for start in range(0, events, chunk):
        n = min(chunk, events - start)
        publish_many(
            "burst:events", [("wave_completed", {"wave_id": start + i}) for i in range(0, n, 50)]
        )
        publish_many(
            "agent:bench_s0_coder",
            [("text", {"text": f"token {i}"}) for i in range(n - len(range(0, n, 50)))],
        )
    end = Event.objects.latest("id").pk
    outgoing._send_on_commit = lambda ids: None  # type: ignore[assignment]
    began = time.monotonic()
    passes = 0
    while OutboxCursor.objects.get(name=outgoing.CURSOR).last_event_id < end:
        outgoing.outbox_scan()
        passes += 1
    elapsed = time.monotonic() - began
    deliveries = WebhookDelivery.objects.count()
    return {
        "outbox_events": events,
        "outbox_passes": passes,
        "outbox_events_per_s": round(events / elapsed, 1),
        "outbox_deliveries": deliveries,
        "outbox_deliveries_per_s": round(deliveries / elapsed, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=500.0, help="deliveries per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=16, help="client connections")
    parser.add_argument("--outbox-events", type=int, default=50_000)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    figures = run(args.rate, args.seconds, args.threads)
    figures["service_only_per_s"] = round(service_only(2000, 8), 1)
    figures.update(outbox(args.outbox_events))
    if args.json:
        print(json.dumps(figures))
        return
    print(
        f"webhook ingest: {figures['deliveries']} signed deliveries at {args.rate:.0f}/s "
        f"for {args.seconds:.0f} s -> {figures['achieved_per_s']}/s achieved "
        "(target 500/s without loss)"
    )
    print(
        f"  answered 202: {figures['accepted']}; rows: {figures['rows']}; lost: {figures['lost']}; "
        f"quanta filed: {figures['quanta']} of {figures['quanta_expected']}"
    )
    print(
        f"  latency p50 {figures['p50_ms']} ms, p95 {figures['p95_ms']} ms, p99 {figures['p99_ms']} ms"
    )
    print(f"  the service alone (no HTTP, 8 threads): {figures['service_only_per_s']}/s")
    print(
        f"outbox: {figures['outbox_events']} events (1 in 50 for two endpoints) in "
        f"{figures['outbox_passes']} passes: {figures['outbox_events_per_s']} events/s, "
        f"{figures['outbox_deliveries']} deliveries recorded "
        f"({figures['outbox_deliveries_per_s']}/s)"
    )


if __name__ == "__main__":
    main()
