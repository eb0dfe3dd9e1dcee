"""The control room's speed.

1. Live latency: an event published by another process (as a Celery worker would) until its
   rendered fragment arrives in a websocket client connected to daphne: p50 / p95 over 500
   events (target p95 < 150 ms). The client is subscribed as the Focus page, so every event is
   rendered to HTML on the way.
2. Dashboard: render time of `/` with 100,000 quanta and 10,000 runs in the current wave, each
   run with an agent, half of them live, and 100 recent events (target < 100 ms): once as
   served (quanta by status and the all-time spend shared for DASHBOARD_TOTALS_TTL_S), once
   with those totals counted on every render; and its query count.

    python bench/ui_latency.py [--events 500] [--quanta 100000] [--runs 10000] [--no-live]
Uses the dev services (make bench) with a database of its own (annihilation_bench_ui, emptied first).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))
os.environ.setdefault("DEBUG", "true")

from bench._setup import daphne_serving, django_bench_db, ms, pct  # noqa: E402

django_bench_db("annihilation_bench_ui")  # sets DATABASE_URL for the subprocesses too

from django.contrib.auth.models import User  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext, override_settings  # noqa: E402

from bursts.models import AgentRun, Burst, QuantumRun, Wave  # noqa: E402
from core.models import Event  # noqa: E402
from quanta.models import Quantum  # noqa: E402

PUBLISHER = """
import os, sys, time, django
sys.path.insert(0, {base!r})
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "annihilation.settings")
django.setup()
from core.events import flush_live, publish
for i in range({n}):
    publish({topic!r}, "text", {{"agent_run_id": {run_id}, "text": f"token {{i}}", "t": time.time()}})
    time.sleep(0.01)
flush_live(10)
"""


class WebSocket:
    """Just enough of RFC 6455 for a benchmark client: text frames, client-side masking."""

    def __init__(self, host: str, port: int, path: str, cookie: str) -> None:
        self.sock = socket.create_connection((host, port))
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                f"Sec-WebSocket-Version: 13\r\nOrigin: http://{host}:{port}\r\n"
                f"Cookie: {cookie}\r\n\r\n"
            ).encode()
        )
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self.buf += self.sock.recv(4096)
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        assert b" 101 " in head.split(b"\r\n")[0], head

    def send(self, data: dict[str, object]) -> None:
        payload = json.dumps(data).encode()
        mask = os.urandom(4)
        header = bytes([0x81]) + (
            bytes([0x80 | len(payload)])
            if len(payload) < 126
            else bytes([0x80 | 126]) + struct.pack("!H", len(payload))
        )
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv(self) -> dict[str, object]:
        first, second = self._read(2)
        length = second & 0x7F
        if length == 126:
            length = struct.unpack("!H", self._read(2))[0]
        elif length == 127:
            length = struct.unpack("!Q", self._read(8))[0]
        data = self._read(length)
        if first & 0x0F != 1:
            return self.recv()
        return dict(json.loads(data))


def session_cookie() -> str:
    user, _ = User.objects.get_or_create(username="bench-operator", is_superuser=True)
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


def live_latency(n: int) -> None:
    quantum = Quantum.objects.create(title="bench focus")
    run = AgentRun.objects.create(agent_id=f"{quantum.pk}_s0_bench", quantum=quantum, role="bench")
    topic = f"agent:{run.agent_id}"
    with daphne_serving(start_s=20) as port:
        ws = WebSocket("127.0.0.1", port, "/ws/events/", session_cookie())
        ws.send({"subscribe": [topic], "page": "focus", "params": {"agent_run_id": run.pk}})
        publisher = subprocess.Popen(
            [sys.executable, "-c",
             PUBLISHER.format(base=str(BASE), n=n, topic=topic, run_id=run.pk)],
            env=os.environ.copy(),
        )  # fmt: skip
        samples: list[float] = []
        ws.sock.settimeout(30)
        while len(samples) < n:
            message = ws.recv()
            event = message.get("event")
            assert isinstance(event, dict) and "html" in message, message
            samples.append(time.time() - float(event["payload"]["t"]))
        publisher.wait(30)
    print(
        f"live fragment latency over {n} events (publisher process -> daphne -> client): "
        f"p50 {ms(statistics.median(samples))}, p95 {ms(pct(samples, 95))}, "
        f"max {ms(max(samples))} (target p95 < 150 ms)"
    )


def dashboard(quanta: int = 100_000, runs: int = 10_000) -> None:
    Quantum.objects.filter(title__startswith="bench dash").delete()
    Wave.objects.all().delete()
    Quantum.objects.bulk_create(
        [
            Quantum(title=f"bench dash {i}", status=("open", "closed", "blocked")[i % 3])
            for i in range(quanta)
        ],
        batch_size=2000,
    )
    wave = Wave.objects.create(labels=["bench"])
    bursts = [Burst.objects.create(wave=wave, number=n + 1) for n in range(10)]
    ids = list(
        Quantum.objects.filter(title__startswith="bench dash").values_list("id", flat=True)[:runs]
    )
    made = QuantumRun.objects.bulk_create(
        [
            QuantumRun(
                wave=wave,
                burst=bursts[i % 10],
                quantum_id=qid,
                pipeline_name="default",
                status=("done", "running", "error")[i % 3],
            )
            for i, qid in enumerate(ids)
        ],
        batch_size=2000,
    )
    AgentRun.objects.bulk_create(
        [
            AgentRun(
                agent_id=f"{r.quantum_id}_s0_coder",
                quantum_id=r.quantum_id,
                quantum_run=r,
                role="coder",
                status=("done", "running")[i % 2],
                phase=("done", "thinking")[i % 2],
                tokens_in=1000,
                tokens_out=100,
            )
            for i, r in enumerate(made)
        ],
        batch_size=2000,
    )
    Event.objects.bulk_create(
        [
            Event(
                topic="burst:events",
                type="run_finished",
                payload={"wave_id": wave.pk, "run_id": r.pk, "status": r.status, "stats": {}},
            )
            for r in made[:100]
        ]
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # the planner's statistics, as autovacuum keeps them
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(User.objects.get_or_create(username="bench-operator", is_superuser=True)[0])
    client.get("/")  # warm templates and connections
    connection.queries_log.clear()  # full (DEBUG): the capture would count nothing
    with CaptureQueriesContext(connection) as queries:
        client.get("/")
    for ttl, what in ((None, "totals shared for DASHBOARD_TOTALS_TTL_S"), (0, "totals counted")):
        with override_settings(**({} if ttl is None else {"DASHBOARD_TOTALS_TTL_S": ttl})):
            times, cpu = renders(client, 40)
        print(
            f"dashboard with {quanta} quanta and {runs} runs ({what}): median "
            f"{ms(statistics.median(times))}, p95 {ms(pct(times, 95))}, CPU median "
            f"{ms(statistics.median(cpu))}, {len(queries)} queries, load {os.getloadavg()[0]:.1f} "
            "(target < 100 ms)"
        )


def renders(client: Client, n: int) -> tuple[list[float], list[float]]:
    """Wall and CPU (this process: the view, the template, the client) of `n` renders of `/`."""
    times: list[float] = []
    cpu: list[float] = []
    for _ in range(n):
        started, cpu_started = time.perf_counter(), time.process_time()
        response = client.get("/")
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - cpu_started)
        assert response.status_code == 200
    return times, cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--quanta", type=int, default=100_000, help="quanta on the dashboard")
    parser.add_argument("--runs", type=int, default=10_000, help="runs in the current wave")
    parser.add_argument("--no-live", action="store_true", help="the dashboard figure only")
    args = parser.parse_args()
    if not args.no_live:
        live_latency(args.events)
    dashboard(args.quanta, args.runs)


if __name__ == "__main__":
    main()
