"""Removing the worktrees of closed quanta."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from django.conf import settings

from bursts.models import AGENT_LIVE, AgentRun
from psychonauts.workspaces.worktrees import workspace_remove
from quanta.models import Quantum, QuantumStatus

logger = logging.getLogger(__name__)


def workspaces_sweep() -> list[int]:
    """Remove the worktrees of closed quanta that no agent works in; returns their ids.

    git checks every registered worktree when it adds one, so a repository that kept them all
    would make each new quantum slower (git's work grows with the worktrees registered). The beat runs this every PSYCHONAUTS_WORKSPACE_SWEEP_S.
    """
    folder = Path(settings.PSYCHONAUTS_WORKTREES)
    if settings.PSYCHONAUTS_WORKSPACE_MODE != "worktree" or not folder.is_dir():
        return []
    ids = [int(p.name[2:]) for p in folder.iterdir() if re.fullmatch(r"q-\d+", p.name)]
    removed = []
    for quantum_id in _idle_closed(ids):
        # Looked at again just before: a quantum reopened and started meanwhile keeps its tree.
        if _idle_closed([quantum_id]) and workspace_remove(quantum_id=quantum_id):
            removed.append(quantum_id)
    if removed:
        logger.info("removed the worktrees of %d closed quanta", len(removed))
    return removed


def _idle_closed(quantum_ids: list[int]) -> list[int]:
    busy = AgentRun.objects.filter(quantum_id__in=quantum_ids, status__in=AGENT_LIVE)
    return list(
        Quantum.objects.filter(pk__in=quantum_ids, status=QuantumStatus.CLOSED)
        .exclude(pk__in=busy.values("quantum_id"))
        .values_list("pk", flat=True)
    )
