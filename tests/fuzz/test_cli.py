"""Every management command, random arguments: success, or a CommandError (exit 1 or 2) with
the database as it was. Never another exception."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from hypothesis import event, given
from hypothesis import strategies as st

from bursts.models import Wave
from quanta.models import Comment, Dependency, Quantum
from quanta.pipeline_models import Pipeline, Stage
from tests.factories import make_chain
from tests.fuzz.conftest import FUZZ

pytestmark = pytest.mark.django_db

SUBCOMMANDS = {
    "quanta": ["create", "list", "show", "update", "close", "reopen", "defer", "dep", "comment",
               "ready", "blocked", "search", "import", "export"],
    "pipelines": ["load", "list", "show"],
    "waves": ["list", "show", "cancel"],
    "tether": ["questions", "answer", "drifts", "ground", "reject", "note", "changes",
               "show-change", "approve", "reject-change", "mutations", "approve-mutation",
               "reject-mutation"],
    "psychonaut": ["roles", "agents"],
}  # fmt: skip
TOKENS = [
    "--json", "--priority", "--label", "--kind", "--limit", "--reason", "--parent", "--depends-on",
    "--status", "--format", "--body", "--title", "--no-parent", "--author", "--verify", "--help",
    "--replace-default", "add", "rm", "load", "list", "task", "closed", "jsonl", "1", "2", "0",
    "-1", "3.5", "1e9", "99999999999999999999", "9223372036854775808", "#1", "q1", "٣", "", " ",
    "a\x00b", "caf\udce9", "/dev/zero", "/etc/passwd", "/", "../../x", "<script>", "x" * 300,
    "-", "--", "nan", "inf",
]  # fmt: skip
arguments = st.lists(st.one_of(st.sampled_from(TOKENS), st.text(max_size=12)), max_size=6)


def snapshot() -> dict[str, Any]:
    return {
        "quanta": list(Quantum.objects.order_by("id").values_list("id", "status", "title", "updated_at")),
        "comments": Comment.objects.count(),
        "dependencies": Dependency.objects.count(),
        "pipelines": list(Pipeline.objects.order_by("id").values_list("name", "version", "is_default")),
        "stages": Stage.objects.count(),
        "waves": list(Wave.objects.order_by("id").values_list("id", "status")),
    }  # fmt: skip


def run_command(name: str, args: list[str]) -> None:
    before = snapshot()
    try:
        call_command(name, *args, stdout=StringIO(), stderr=StringIO())
    except CommandError as exc:
        assert exc.returncode in (1, 2), (name, args, exc.returncode)
        assert len(str(exc)) < 5000
        assert snapshot() == before, (name, args)
        event(f"{name}: refused")
    except SystemExit as exc:  # --help
        assert exc.code in (0, 1, 2), (name, args)
        assert snapshot() == before, (name, args)
        event(f"{name}: exit {exc.code}")
    else:
        event(f"{name}: done")


@FUZZ
@given(
    command=st.sampled_from([(c, sub) for c, subs in SUBCOMMANDS.items() for sub in subs]),
    args=arguments,
)
def test_commands_refuse_bad_arguments_cleanly(command: tuple[str, str], args: list[str]) -> None:
    if not Quantum.objects.exists():
        make_chain(2)  # something for the ids to find
    name, subcommand = command
    run_command(name, [subcommand, *args])


@FUZZ
@given(labels=st.lists(st.one_of(st.sampled_from(TOKENS), st.text(max_size=70)), max_size=3))
def test_start_wave_refuses_bad_labels_cleanly(labels: list[str]) -> None:
    run_command("start_wave", [f"--label={label}" for label in labels])
