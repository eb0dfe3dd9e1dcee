"""The control room's speed.

1. Live latency: an event published by another process (as a Celery worker would) until its
   rendered fragment arrives in a websocket client connected to daphne: p50 / p95 over 500
   events (target p95 < 150 ms). The client is subscribed as the Focus page, so every event is
   rendered to HTML on the way.
2. Dashboard: render time of `/` with 10,000 quanta and 1,000 runs (target < 200 ms), and its
   query count.

    python bench/ui_latency.py [--events 500]
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
from django.test.utils import CaptureQueriesContext  # noqa: E402

from bursts.models import AgentRun, Burst, QuantumRun, Wave  # noqa: E402
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


def dashboard(quanta: int = 10_000, runs: int = 1_000) -> None:
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
        ]
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
        ]
    )
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(User.objects.get(username="bench-operator"))
    client.get("/")  # warm templates and connections
    times: list[float] = []
    for _ in range(20):
        started = time.perf_counter()
        response = client.get("/")
        times.append(time.perf_counter() - started)
        assert response.status_code == 200
    with CaptureQueriesContext(connection) as queries:
        client.get("/")
    print(
        f"dashboard with {quanta} quanta and {runs} runs: median {ms(statistics.median(times))}, "
        f"p95 {ms(pct(times, 95))}, {len(queries)} queries (target < 200 ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=500)
    args = parser.parse_args()
    live_latency(args.events)
    dashboard()


if __name__ == "__main__":
    main()
