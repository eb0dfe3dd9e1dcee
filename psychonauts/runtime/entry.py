"""The agent runtime's entry at the burst manager's executor seam (`bursts.executor.EXECUTOR`,
registered by psychonauts/hooks.py).

Light to import: the runtime, and the model SDKs it brings, load at the first agent run, so a
process that runs none (the web, a management command) never pays for them. A worker loads
them before its first task (psychonauts/runtime/warmup.py).
"""

from __future__ import annotations

from bursts.executor import Outcome


def agent_run(*, agent_run_id: int) -> Outcome:
    """Execute (or resume) one agent run to its outcome (`runtime.execute.agent_run_execute`)."""
    from psychonauts.runtime.execute import agent_run_execute

    return agent_run_execute(agent_run_id=agent_run_id)
