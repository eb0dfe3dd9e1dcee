"""A wave on a real worker with a hostile agent and a legitimate one, both in the real sandbox."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from bursts.models import WaveStatus
from bursts.services import wave_start
from psychonauts.models import CommandTrauma, TraumaSource
from psychonauts.workspaces.repository import branch_for
from psychonauts.workspaces.worktrees import demo_repo_ensure
from quanta.services import quantum_create
from tests.bursts.conftest import Worker, pipeline, wait_wave

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing"),
]

HOSTILE = """
name: hostile
match: {roles: [coder]}
turns:
  - text: "Trying the obvious."
    tools:
      - shell: {command: "echo pwned > {outside}/pwned.txt"}
      - shell: {command: "git branch -D {other_branch}"}
      - shell: {command: "cat /proc/$PPID/environ"}
  - text: "Trying what the guard lets through."
    tools:
      - write_file: {path: "evil.py", content: "import os, pathlib\\nfor p in ['{outside}/pwned.txt', '{repo}/.git/refs/heads/evil', '/usr/pwned']:\\n    try:\\n        pathlib.Path(p).write_text('x')\\n    except OSError as e:\\n        print('blocked', e)\\nprint(sorted(os.environ))\\n"}
      - shell: {command: "python3 evil.py"}
  - text: "Done."
"""

LEGIT = """
name: legit
match: {roles: [coder]}
turns:
  - text: "Writing the code and its test."
    tools:
      - write_file: {path: "pkg/calc.py", content: "def mul(a, b):\\n    return a * b\\n"}
      - write_file: {path: "pkg/__init__.py", content: ""}
      - write_file: {path: "test_mul.py", content: "from pkg.calc import mul\\nassert mul(3, 4) == 12\\nprint('mul ok')\\n"}
  - text: "Running the test."
    tools:
      - shell: {command: "python3 test_mul.py && echo 'generated' > pkg/out.txt && ls pkg"}
  - text: "mul added and tested."
"""


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest() if p.is_file() else ""
        for p in sorted(root.rglob("*"))
    }


def test_a_hostile_agent_changes_nothing_outside_while_a_legitimate_one_is_committed(
    make_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    repo = demo_repo_ensure(home / "repo")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep\n")
    subprocess.run(["git", "branch", "annihilation/q-999"], cwd=repo, check=True)
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    fill = {"{outside}": str(outside), "{repo}": str(repo), "{other_branch}": "annihilation/q-999"}
    for name, text in (("hostile", HOSTILE), ("legit", LEGIT)):
        for key, value in fill.items():
            text = text.replace(key, value)
        (scripts / f"{name}.yaml").write_text(text)
    make_worker(
        "sandboxed",
        ANNIHILATION_BURSTS_EXECUTOR="psychonauts",
        ANNIHILATION_HOME=str(home),
        ANNIHILATION_REPO=str(repo),
        ANNIHILATION_SCRIPT_DIRS=str(scripts),
        ANNIHILATION_SANDBOX="on",
        # Caution-tier commands allowed, so the sandbox alone stands between them and the host.
        ANNIHILATION_COMMAND_ALLOW=".*",
        ANNIHILATION_TEST_WORKER_SECRET="worker-only-value-3141",
    )
    pipeline("sandboxed", {"name": "implement", "mode": "sequential", "agents": ["coder"]},
             default=True)  # fmt: skip
    before_outside = _tree(outside)
    refs_before = subprocess.run(
        ["git", "for-each-ref"], cwd=repo, capture_output=True, text=True
    ).stdout
    hostile = quantum_create(title="hostile", labels=["script:hostile"])
    legit = quantum_create(title="legit", labels=["script:legit"])

    wave = wait_wave(wave_start().pk, timeout=90)

    assert wave.status == WaveStatus.DONE
    assert _tree(outside) == before_outside and not Path("/usr/pwned").exists()
    refs_after = subprocess.run(
        ["git", "for-each-ref", "--format=%(refname) %(objectname)"], cwd=repo,
        capture_output=True, text=True,
    ).stdout  # fmt: skip
    assert "refs/heads/annihilation/q-999" in refs_after and "refs/heads/evil" not in refs_after
    assert refs_before.count("q-999") == refs_after.count("q-999") == 1
    # The guard's refusals are the hostile quantum's traumas only; what evil.py printed is none.
    traumas = set(CommandTrauma.objects.values_list("source", "quantum_id"))
    assert traumas == {(TraumaSource.GUARD, hostile.pk)}
    from psychonauts.models import ToolCall

    outputs = "\n".join(ToolCall.objects.values_list("output", flat=True))
    assert (
        "worker-only-value-3141" not in outputs and "ANNIHILATION_TEST_WORKER_SECRET" not in outputs
    )
    assert "mul ok" in outputs
    files = subprocess.run(
        ["git", "show", "--name-only", "--format=", branch_for(legit.pk)], cwd=repo,
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert {"pkg/calc.py", "pkg/__init__.py", "test_mul.py", "pkg/out.txt"} <= set(files)
    evil = subprocess.run(
        ["git", "show", f"{branch_for(hostile.pk)}:evil.py"], cwd=repo, capture_output=True
    )
    assert evil.returncode == 0  # its own worktree is its own to write
