"""Where the agent runtime plugs into the apps below it (core.hooks), and nowhere else:
imported by `PsychonautsConfig.ready()`.

The burst manager's stage tasks reach the runtime through `bursts.executor.EXECUTOR`:
`execute_agent` calls `runtime.entry.agent_run`, which loads the runtime at the first agent run
and calls `agent_run_execute` (psychonauts/runtime/execute.py), whose runner takes the agent's
turns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from bursts.executor import EXECUTOR
from bursts.hooks import ON_RUNS_DRAINED, WAVE_CHECKS
from bursts.sections import WAVE_SECTIONS, WaveSection
from core.warmups import WARMUPS
from psychonauts.containment.identities import identities_release
from psychonauts.containment.verify import verify_command_problem
from psychonauts.preflight import wave_problems
from psychonauts.runtime.entry import agent_run
from psychonauts.selectors import role_names, wave_spend_context
from quanta.fields import VERIFY_COMMAND_CHECK
from quanta.pipelines.services import ROLE_NAMES

if TYPE_CHECKING:
    from bursts.models import QuantumRun


def on_runs_drained(drained: Sequence[tuple[QuantumRun, str]]) -> None:
    """The drained runs' quanta run no command any more: their sandbox uids are released (one
    statement for the whole drain)."""
    identities_release(quantum_ids=[run.quantum_id for run, _ in drained])


def agents_warm_up(concurrency: int) -> None:
    """The sandbox probe and the model clients, made before a worker's first task. Imported
    here, not above: only a worker runs it, and the model SDK takes about a second to load."""
    from psychonauts.runtime.warmup import agents_warm_up

    agents_warm_up(concurrency)


EXECUTOR.register(agent_run)
ROLE_NAMES.register(role_names)
VERIFY_COMMAND_CHECK.register(verify_command_problem)
WARMUPS.register(agents_warm_up)
ON_RUNS_DRAINED.register(on_runs_drained)
WAVE_CHECKS.register(wave_problems)
# The wave page's spend: by role, its cache share, and its projected cost.
WAVE_SECTIONS.register(WaveSection("psychonauts/_wave_spend.html", wave_spend_context))
