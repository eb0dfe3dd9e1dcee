"""What reflection adds to the layers below through their hooks: the playbook's section of every
agent's prompt (psychonauts.sections.PROMPT_SECTIONS) and the rules' and skills' outcomes counted
when the burst manager drains runs (bursts.hooks.ON_RUNS_DRAINED).

The services are loaded by the first call (a prompt built, a run drained), not when the apps
load: every process registers these, and a command that builds no prompt loads none of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bursts.models import AgentRun, QuantumRun


def playbook_section(run: AgentRun) -> str:
    """reflection.services.injection.playbook_section."""
    from reflection.services.injection import playbook_section as section

    return section(run)


def on_runs_drained(drained: Sequence[tuple[QuantumRun, str]]) -> None:
    """reflection.services.injection.on_runs_drained."""
    from reflection.services.injection import on_runs_drained as count

    count(drained)
