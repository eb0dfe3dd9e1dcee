"""Reads for the Focus page: one agent run's stream, header, tool calls, diary and worktree
diff. The page is live: each event of the run redraws what it can have changed
(psychonauts.views.focus_live)."""

from __future__ import annotations

from django.db.models import QuerySet

from bursts.models import AgentRun
from core.models import Event
from core.redaction import redact
from core.redis import get_redis
from psychonauts.models import AgentTurn, DiaryEntry, ToolCall
from psychonauts.workspaces.central import base_branch, fetch_or_last, tracking
from psychonauts.workspaces.git import git_run
from psychonauts.workspaces.repository import branch_for, repo_local, repo_url
from repos.context import working_on_quantum

DIFF_LIMIT = 200_000  # characters: a page, not a repository dump


def agent_stream(*, run: AgentRun, limit: int = 500) -> list[Event]:
    """The run's published events, oldest first (index event_topic_seq, then the payload id)."""
    rows = (
        Event.objects.filter(topic=f"agent:{run.agent_id}", payload__agent_run_id=run.pk)
        .defer("search")
        .order_by("-id")[:limit]
    )
    return list(reversed(rows))


def agent_turns(*, agent_run_id: int) -> int:
    """How many turns the run has begun (its header's `turn`)."""
    return AgentTurn.objects.filter(agent_run_id=agent_run_id).count()


def agent_tool_calls(*, agent_run_id: int) -> QuerySet[ToolCall]:
    return ToolCall.objects.filter(agent_run_id=agent_run_id).order_by("turn_index", "id")


def agent_diary(*, agent_run_id: int) -> QuerySet[DiaryEntry]:
    return DiaryEntry.objects.filter(agent_run_id=agent_run_id).order_by("created_at", "id")


def worktree_diff(*, quantum_id: int) -> str:
    """What the quantum's branch changed against the repository's HEAD ("" when nothing; for a
    central repository: against its base branch, both as this host last fetched them),
    redacted: the branch keeps what the agent wrote, the page shows no secret of it.

    No network: a page's request never waits on the central repository (the page's view asks a
    worker to fetch, `focus_fetch_due`, and the page shows the result on its next draw)."""
    with working_on_quantum(quantum_id):
        return _worktree_diff(quantum_id)


def _worktree_diff(quantum_id: int) -> str:
    repo = repo_local()
    if not (repo / ".git").exists():
        return ""
    base, branch = "HEAD", branch_for(quantum_id)
    if repo_url():  # a central repository: its base and the branch as last fetched here
        base, branch = tracking(base_branch()), tracking(branch)
    result = git_run("diff", "--no-color", f"{base}...{branch}", cwd=repo, timeout=10)
    if result.returncode != 0:
        return ""  # no branch yet: the agent has not touched the workspace
    return redact(result.stdout[:DIFF_LIMIT])


# A page open, its live redraws and its reloads ask for one fetch per quantum in this long.
FETCH_EVERY_S = 10


def focus_fetch_due(*, quantum_id: int) -> bool:
    """Whether a worker is to fetch the quantum's branch and its base now (the page's view sends
    the task): in remote mode, at most once per FETCH_EVERY_S per quantum."""
    with working_on_quantum(quantum_id):
        if not repo_url():
            return False
    return bool(get_redis().set(f"focus:fetch:{quantum_id}", 1, nx=True, ex=FETCH_EVERY_S))


def focus_branches_fetch(*, quantum_id: int) -> None:
    """Fetch the quantum's branch and its base into this host's clone (what the Focus diff
    reads); an unreachable central repository leaves the last fetched state."""
    with working_on_quantum(quantum_id):
        if repo_url():
            fetch_or_last([base_branch(), branch_for(quantum_id)])
