"""A failing test command as a finding: one per command, named by the command (its output
changes every run; the finding does not)."""

from __future__ import annotations

from autopilot.scanners import ScanFinding, clean_text

SCANNER = "tests"
RULE = "failing"
TAIL_LINES = 40
TAIL_CHARS = 4_000


def output_tail(output: str) -> str:
    """The end of a command's output, where test runners put their summary."""
    tail = "\n".join(output.rstrip().splitlines()[-TAIL_LINES:])
    tail = tail[-TAIL_CHARS:]
    return "\n".join(clean_text(line, TAIL_CHARS) for line in tail.splitlines())


def failing_tests(
    command: str, *, returncode: int, stopped: str, output: str
) -> ScanFinding | None:
    """The finding of a test command's run, or None when it passed."""
    if returncode == 0 and not stopped:
        return None
    why = {"timeout": "timed out", "output": "stopped: too much output"}.get(
        stopped, f"exit status {returncode}"
    )
    tail = output_tail(output)
    return ScanFinding(
        scanner=SCANNER,
        path="",
        line=0,
        rule=RULE,
        message=f"`{clean_text(command, 300)}` failed ({why})" + (f":\n{tail}" if tail else ""),
        key=command,
    )
