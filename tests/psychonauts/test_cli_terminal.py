"""What the CLI prints reaches the operator's terminal as text: escape sequences (CSI, OSC, OSC 52
clipboard writes), C1 controls and bidi overrides from titles, an agent's text and its tools'
output are shown as escapes, never acted on; the commands' own colours stay."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from quanta.models import Quantum

pytestmark = pytest.mark.django_db

# Each a control a terminal acts on: a clipboard write, a title change, a cursor move and erase,
# the 8-bit CSI, a carriage return that overwrites, a bidi override, a DEL, a bell.
HOSTILE = (
    "\x1b]52;c;ZWNobyBwd25lZA==\x07",
    "\x1b]0;owned\x1b\\",
    "\x1b[2J\x1b[1;1H",
    "\x9b31m",
    "safe\rEVIL",
    "\u202edelbmarcs\u202c",
    "\u2066iso\u2069",
    "del\x7f",
)
# Anything a terminal would act on, bar the commands' own SGR colours (`ESC [ digits m`).
ACTED_ON = re.compile(
    r"\x1b(?!\[[0-9;]*m)|[\x00-\x08\x0b-\x1a\x1c-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def assert_terminal_safe(printed: str) -> None:
    found = [printed[max(0, m.start() - 10) : m.end() + 10] for m in ACTED_ON.finditer(printed)]
    assert not found, f"control characters reached the terminal: {found!r}"


def test_titles_from_outside_are_shown_as_escapes_in_lists_and_details():
    quanta = [
        Quantum.objects.create(title=f"title {n} {text} end") for n, text in enumerate(HOSTILE)
    ]

    for args in (["list"], ["show", str(quanta[0].pk)], ["search", "title"]):
        out = StringIO()
        call_command("quanta", *args, stdout=out)
        assert_terminal_safe(out.getvalue())
    out = StringIO()
    call_command("quanta", "list", stdout=out)
    printed = out.getvalue()
    assert "title 0 \\x1b]52;c;ZWNobyBwd25lZA==\\x07 end" in printed
    assert "\\u202edelbmarcs\\u202c" in printed


SAID = json.dumps("Hello " + " ".join(HOSTILE) + "\n")
WRITTEN = json.dumps("out " + " ".join(HOSTILE))
ENDED = json.dumps("Done " + HOSTILE[0])
HOSTILE_AGENT = f"""
name: hostile-terminal
match: {{roles: [coder], labels: [hostile-terminal]}}
turns:
  - text: {SAID}
    tools:
      - write_file: {{path: "notes.txt", content: {WRITTEN}}}
  - tools:
      - read_file: {{path: "notes.txt"}}
  - text: {ENDED}
"""


def test_an_agents_text_and_tool_output_in_psychonaut_run_act_on_nothing(
    repo: Path,
    scripts: Callable[[str, str], None],
    make_quantum: Callable[..., Quantum],
    capsys: pytest.CaptureFixture[str],
):
    scripts("hostile-terminal", HOSTILE_AGENT)
    quantum = make_quantum(labels=["hostile-terminal"])

    call_command(
        "psychonaut", "run", "--role", "coder", "--quantum", str(quantum.pk),
        "--provider", "scripted", force_color=True,
    )  # fmt: skip

    printed = capsys.readouterr().out
    assert "Hello \\x1b]52;c;ZWNobyBwd25lZA==\\x07" in printed  # the agent's text
    assert "out \\x1b]52;c;ZWNobyBwd25lZA==\\x07" in printed  # a tool's output
    assert "\x1b[" in printed  # the command's own colours (forced) are kept
    assert_terminal_safe(printed)
