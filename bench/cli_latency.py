"""Command-line latency: how long `manage.py tether questions` and `tether answer` take from
the shell's point of view (process start to exit), beside two baselines measured in the same
run: `python -c 'import django'` (the interpreter and Django alone) and `manage.py help` (the
project's settings and apps loaded, no command run). A loaded machine slows all four alike: the
baselines say how loaded it was.

Prints the median and the best of N runs for each, and which model SDKs the commands imported
(none: a command that calls no model imports none).

    .venv/bin/python bench/cli_latency.py [N]      (needs `make services`; default N = 7)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 0.7  # on a quiet machine, for `tether questions` and `tether answer`
SDKS = ("anthropic", "openai")


def timed(argv: list[str], runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        samples.append(time.perf_counter() - start)
    return samples


def sdks_imported(argv: list[str]) -> list[str]:
    """The model SDKs the command imports (from `-X importtime`, which writes to stderr)."""
    proc = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]], cwd=ROOT, capture_output=True, text=True
    )
    names = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines()}
    return [sdk for sdk in SDKS if sdk in names]


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "annihilation.settings")
    python = sys.executable
    manage = [python, "manage.py"]
    # An answer to a question that does not exist: the whole command runs (settings, apps,
    # database) and is refused at the end, so the benchmark changes nothing.
    cases = {
        "python -c 'import django'": [python, "-c", "import django"],
        "manage.py help": [*manage, "help"],
        # What the commands paid before they stopped importing it (the SDK alone).
        "python -c 'import anthropic'": [python, "-c", "import anthropic"],
        "manage.py tether questions": [*manage, "tether", "questions"],
        "manage.py tether answer (refused)": [*manage, "tether", "answer", "999999999", "yes"],
    }
    print(f"cli_latency: {runs} runs each, wall time from process start to exit")
    print(f"{'command':40} {'median':>8} {'best':>8}  model SDKs imported")
    for name, argv in cases.items():
        samples = timed(argv, runs)
        imported = ", ".join(sdks_imported(argv)) if name.startswith("manage.py tether") else ""
        print(
            f"{name:40} {statistics.median(samples):7.2f}s {min(samples):7.2f}s  "
            f"{imported or ('none' if name.startswith('manage.py tether') else '')}"
        )
    print(f"target on a quiet machine: < {TARGET_S} s for the two tether commands")


if __name__ == "__main__":
    main()
