"""Traumas: one agent's incidents change what its own quantum may run, never the others'."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from pytest_django.fixtures import Settings as SettingsWrapper

from psychonauts.containment.guard import Policy, command_judge
from psychonauts.containment.traumas import trauma_apply_everywhere, trauma_pattern
from psychonauts.models import CommandTrauma, TraumaSource
from psychonauts.runtime.tools import tool_execute
from tests.psychonauts.sandboxed import agent_context, worktrees

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing"),
]

A, B = 11, 12
SANDBOXED = Policy(sandboxed=True)


@pytest.fixture
def trees(tmp_path: Path, settings: SettingsWrapper) -> dict[int, Path]:
    settings.SANDBOX_OUTPUT_BYTES = 64 * 2**10
    return worktrees(tmp_path, settings, A, B)


def _shell(trees: dict[int, Path], quantum: int, command: str) -> tuple[bool, str]:
    result = tool_execute(agent_context(quantum, trees[quantum]), "shell", {"command": command}, [])
    return result.is_error, result.output


def test_output_an_agent_controls_plants_no_trauma(trees: dict[int, Path]) -> None:
    for name in ("MemoryError", "Read-only file system", "std::bad_alloc", "Cannot fork"):
        (trees[A] / name).write_text("")
    (trees[A] / "errors.py").write_text("print('Cannot allocate memory; out of memory')\n")

    planted = [_shell(trees, A, command) for command in ("ls", "python3 errors.py")]
    after = {
        (quantum, command): _shell(trees, quantum, command)
        for quantum in (A, B)
        for command in ("ls", "ls -la", "git status", "false || true", "python3 errors.py")
    }

    assert "MemoryError" in planted[0][1] and "out of memory" in planted[1][1]
    refused = {key: output for key, (error, output) in after.items() if error}
    assert refused == {}
    assert not CommandTrauma.objects.exists()


def test_a_trauma_an_agent_records_applies_to_its_quantum_only(trees: dict[int, Path]) -> None:
    (trees[A] / "big.txt").write_text("x" * 2**20)
    (trees[B] / "big.txt").write_text("small\n")

    flooded = _shell(trees, A, "cat big.txt")
    again = _shell(trees, A, "cat big.txt")
    other = _shell(trees, B, "cat big.txt")
    danger = _shell(trees, A, "echo x > /etc/annihilation-test")

    assert flooded[0] and "printed more than" in flooded[1]
    assert again[0] and "trauma: sandbox: printed more than the output limit" in again[1]
    assert other == (False, other[1]) and "small" in other[1]
    assert danger[0] and "refused (danger)" in danger[1]
    recorded = {(t.source, t.quantum_id) for t in CommandTrauma.objects.all()}
    assert recorded == {(TraumaSource.SANDBOX, A), (TraumaSource.GUARD, A)}


def test_a_trauma_the_operator_confirms_applies_to_every_quantum(
    trees: dict[int, Path], client: Client
) -> None:
    (trees[A] / "big.txt").write_text("x" * 2**20)
    (trees[B] / "big.txt").write_text("small\n")
    _shell(trees, A, "cat big.txt")
    trauma = CommandTrauma.objects.get(source=TraumaSource.SANDBOX)
    assert _shell(trees, B, "cat big.txt")[0] is False
    client.force_login(User.objects.create_superuser("op", password="pw-for-tests-only"))

    response = client.post(
        "/admin/psychonauts/commandtrauma/",
        {"action": "apply_everywhere", "_selected_action": [trauma.pk]},
    )

    assert response.status_code == 302
    trauma.refresh_from_db()
    assert (trauma.quantum_id, trauma.confirmed_by) == (None, "op")
    refused = _shell(trees, B, "cat big.txt")
    assert refused[0] and "trauma: sandbox" in refused[1]


def test_the_operator_confirms_a_trauma_by_its_id(trees: dict[int, Path]) -> None:
    trauma = CommandTrauma.objects.create(
        pattern=trauma_pattern("make deploy"), reason="took the site down", source="guard",
        agent_id=f"{A}_s0_coder", quantum_id=A,
    )  # fmt: skip
    (trees[B] / "Makefile").write_text("deploy:\n\techo deployed\n")
    before = _shell(trees, B, "make deploy")

    trauma_apply_everywhere(trauma_id=trauma.pk, operator="op")

    assert before[0] is False and "deployed" in before[1]
    after = _shell(trees, B, "make deploy")
    assert after[0] and "took the site down" in after[1]


def test_a_recorded_trauma_matches_its_command_and_no_other() -> None:
    one = [(trauma_pattern("ls"), "listed a trap")]
    whole = [(trauma_pattern("make a && make b"), "broke the build")]

    assert not command_judge("ls", traumas=one, policy=SANDBOXED).allowed
    for command in ("false || true", "ls -la", "echo ls", "pytest tools"):
        assert command_judge(command, traumas=one, policy=SANDBOXED).allowed, command
    assert not command_judge("make a && make b", traumas=whole, policy=SANDBOXED).allowed
    assert command_judge("make a", traumas=whole, policy=SANDBOXED).allowed
    assert command_judge("make a && make c", traumas=whole, policy=SANDBOXED).allowed


def test_a_pattern_that_does_not_compile_matches_nothing() -> None:
    traumas = [("(unclosed", "typed by hand"), (trauma_pattern("ls"), "listed a trap")]

    assert command_judge("git status", traumas=traumas, policy=SANDBOXED).allowed
    assert not command_judge("ls", traumas=traumas, policy=SANDBOXED).allowed
