"""What redaction (core.redaction) costs: milliseconds per megabyte of text without secrets (the
common case, on every store and on the streaming hot path) and with a secret every few lines,
and microseconds per short string (an event payload's field); CPU time of this process, so that
the figures hold on a machine shared with other work.

The text is this repository's own Python source (code and prose, as agents read and write),
cut into pieces of `--piece` characters as the writers hand them over; "with secrets" puts one
secret of the test table (tests/core/secret_shapes.py) after every 20th line.

    python bench/redaction.py [--mb 2] [--piece 4000]
Needs no database or Redis.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import time
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "annihilation.settings")
os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))  # a strong one: DEBUG is off

import django  # noqa: E402

django.setup()

from core.redaction import TextStream, redact  # noqa: E402
from tests.core.secret_shapes import SHAPES  # noqa: E402


def corpus(megabytes: float) -> str:
    files = sorted(
        p for p in BASE.rglob("*.py") if ".venv" not in p.parts and "tests" not in p.parts
    )
    text = "".join(p.read_text(errors="replace") for p in files)
    want = int(megabytes * 2**20)
    return (text * (want // len(text) + 1))[:want]


def with_secrets(text: str) -> str:
    lines = text.splitlines(keepends=True)
    values = [shape.text for shape in SHAPES]
    for n in range(0, len(lines), 20):
        lines[n] = lines[n].rstrip("\n") + " " + values[(n // 20) % len(values)] + "\n"
    return "".join(lines)


def ms_per_mb(text: str, piece: int, runs: int = 5) -> float:
    pieces = [text[i : i + piece] for i in range(0, len(text), piece)]
    times = []
    for _ in range(runs):
        started = time.process_time()
        for part in pieces:
            redact(part)
        times.append(time.process_time() - started)
    return statistics.median(times) * 1000 / (len(text) / 2**20)


def stream_ms_per_mb(text: str, delta: int = 40, runs: int = 3) -> float:
    """As a model's streamed deltas are: small pieces, released by whole lines."""
    deltas = [text[i : i + delta] for i in range(0, len(text), delta)]
    times = []
    for _ in range(runs):
        stream = TextStream()
        started = time.process_time()
        for part in deltas:
            stream.feed(part)
        stream.finish()
        times.append(time.process_time() - started)
    return statistics.median(times) * 1000 / (len(text) / 2**20)


def us_per_short(runs: int = 20_000) -> float:
    fields = ["wave_completed", "burst:events", "10_s0_coder", "running", "Add a greeting to the "
              "README and keep the tests green", "done", "/api/quanta/12"]  # fmt: skip
    started = time.process_time()
    for n in range(runs):
        redact(fields[n % len(fields)])
    return (time.process_time() - started) * 1e6 / runs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=2.0)
    parser.add_argument("--piece", type=int, default=4000)
    args = parser.parse_args()
    text = corpus(args.mb)
    redact("warm up the rules: password=" + "x1" * 8)
    print(f"clean text, {args.piece}-char pieces: {ms_per_mb(text, args.piece):.0f} ms/MB")
    dirty = with_secrets(text)
    print(f"a secret every 20 lines:      {ms_per_mb(dirty, args.piece):.0f} ms/MB")
    print(f"streamed, 40-char deltas:     {stream_ms_per_mb(text):.0f} ms/MB")
    print(f"a short field:                {us_per_short():.1f} us")


if __name__ == "__main__":
    main()
