"""The agent loop's edges: bad tool calls, cancel, retries, registry, routing, YAML errors."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from bursts.models import AgentRun, AgentStatus
from core.models import Event
from psychonauts.errors import InvalidDefinition, WorkspaceError
from psychonauts.models import Role, ToolCall
from psychonauts.roles import roles_load
from psychonauts.routing.providers.base import RunInfo
from psychonauts.routing.providers.scripted import script_for, script_parse
from psychonauts.routing.registry import registry_list
from psychonauts.runtime.execute import agent_run_execute
from psychonauts.runtime.runs import agent_run_create
from psychonauts.runtime.tools import ToolContext, tool_execute
from psychonauts.workspaces.git import git, git_run
from psychonauts.workspaces.repository import branch_for
from tests.worktrees import worktree_being_added

pytestmark = pytest.mark.django_db

BAD_TOOLS = """
name: bad-tools
match: {labels: [bad-tools]}
turns:
  - tools:
      - frobnicate: {x: 1}
      - write_file: {path: "a.txt"}
      - write_file: {path: "../escape.txt", content: "x"}
      - shell: {command: "rm -rf /"}
  - text: "survived"
"""


def test_it_returns_bad_tool_calls_to_the_model_as_errors(repo, scripts, make_quantum, make_run):
    scripts("bad-tools", BAD_TOOLS)
    run = make_run("coder", quantum=make_quantum(labels=["bad-tools"]))

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done"
    calls = {
        c.name + str(i): c
        for i, c in enumerate(ToolCall.objects.filter(agent_run=run).order_by("id"))
    }
    outputs = [c.output for c in calls.values()]
    assert all(c.is_error for c in calls.values())
    assert outputs[0].startswith("unknown tool 'frobnicate'")
    assert outputs[1] == "invalid arguments for write_file: content: required"
    assert "`..` leaves the workspace" in outputs[2]
    assert "refused (danger)" in outputs[3]
    assert not (repo.parent / "home" / "worktrees" / "escape.txt").exists()


def _ctx(workspace: Path) -> ToolContext:
    return ToolContext(
        agent_run_id=0, agent_id="1_s0_coder", attempt=1, quantum_id=1, role="coder", depth=0,
        workspace=workspace, shared=False,
    )  # fmt: skip


def test_it_refuses_paths_that_escape_the_workspace(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "secret.txt").write_text("s3cret")
    (ws / "link").symlink_to(tmp_path / "secret.txt")
    (ws / "out").symlink_to(tmp_path)  # a folder link leading out
    (ws / "sub").mkdir()
    (ws / "sub" / "in").symlink_to(ws / "sub")  # one staying inside
    ctx = _ctx(ws)

    for path in ["../secret.txt", "/etc/passwd", "link", "~/x", ".git/config", "out/secret.txt",
                 "sub/in/../../secret.txt"]:  # fmt: skip
        result = tool_execute(ctx, "read_file", {"path": path}, [])
        assert result.is_error, path
        assert "refused" in result.output
    for path in ["ok/x.txt", "sub/in/y.txt"]:
        assert tool_execute(ctx, "write_file", {"path": path, "content": "y"}, []).is_error is False
    assert (ws / "sub" / "y.txt").read_text() == "y"
    below_a_file = tool_execute(ctx, "read_file", {"path": "ok/x.txt/z"}, [])
    assert below_a_file.is_error and "no such file" in below_a_file.output


def test_it_refuses_an_ambiguous_edit(tmp_path):
    ctx = _ctx(tmp_path)
    (tmp_path / "f.py").write_text("x = 1\nx = 1\ny = 2\n")

    ambiguous = tool_execute(ctx, "edit_file", {"path": "f.py", "old": "x = 1", "new": "x = 3"}, [])
    unique = tool_execute(ctx, "edit_file", {"path": "f.py", "old": "y = 2", "new": "y = 5"}, [])

    assert ambiguous.is_error
    assert "ambiguous (2 matches)" in ambiguous.output
    assert not unique.is_error
    assert (tmp_path / "f.py").read_text() == "x = 1\nx = 1\ny = 5\n"


def test_it_requires_a_lease_to_write_in_the_shared_tree(repo, settings, make_run):
    settings.PSYCHONAUTS_WORKSPACE_MODE = "shared"
    ctx, other = _ctx(repo), _ctx(repo)
    other.agent_id = "2_s0_coder"

    ctx.shared = other.shared = True
    refused = tool_execute(ctx, "write_file", {"path": "calc.py", "content": "x"}, [])
    leased = tool_execute(ctx, "lease_acquire", {"path": "calc.py"}, [])
    written = tool_execute(ctx, "write_file", {"path": "calc.py", "content": "x"}, [])
    conflict = tool_execute(other, "lease_acquire", {"path": "calc.py"}, [])

    assert refused.is_error and "no exclusive lease" in refused.output
    assert not leased.is_error
    assert not written.is_error
    assert conflict.is_error and "leased by 1_s0_coder#1" in conflict.output


def test_it_stops_when_the_burst_manager_cancels_the_run(repo, make_run):
    run = make_run("coder")

    def cancel_on_first_tool(kind: str, payload: dict) -> None:
        if kind == "tool_call":
            AgentRun.objects.filter(pk=run.pk).update(status=AgentStatus.CANCELLED)

    outcome = agent_run_execute(agent_run_id=run.pk, observer=cancel_on_first_tool)

    assert outcome.status == "cancelled"
    assert run.turns.count() == 1, "no provider call after the cancel"
    run.refresh_from_db()
    assert run.status == AgentStatus.CANCELLED


def test_it_fails_the_first_attempt_and_succeeds_the_retry(repo, make_quantum, make_run):
    quantum = make_quantum(labels=["flaky"])
    first = make_run("coder", quantum=quantum)

    failed = agent_run_execute(agent_run_id=first.pk)
    second = agent_run_create(quantum_id=quantum.pk, role="coder")
    succeeded = agent_run_execute(agent_run_id=second.pk)

    assert failed.status == "error"
    assert failed.error == "scripted failure on attempt 1 (retry me)"
    assert second.attempt == 2
    assert succeeded.status == "done", succeeded.error
    assert "Succeeded on attempt 2" in succeeded.result


def test_it_includes_the_threaded_context_verbatim_in_the_prompt(repo, make_run):
    from psychonauts.runtime.prompt import agent_prompt

    context = "## Stage 0 Results\n### Agent: 1_s0_planner\n1. do *this*\n2. then that"
    run = make_run("coder", context=context)

    assert context in agent_prompt(run)


def test_it_runs_a_trivial_mechanical_quantum_without_a_model(
    repo, make_quantum, make_run, settings
):
    settings.PSYCHONAUTS_TRIVIAL_NO_LLM = True
    quantum = make_quantum(
        title="Bump the version", body="$ printf '1.1\\n' > VERSION", complexity="trivial"
    )
    run = make_run("coder", quantum=quantum, provider="anthropic")

    outcome = agent_run_execute(agent_run_id=run.pk)

    run.refresh_from_db()
    assert outcome.status == "done", outcome.error
    assert (run.provider, run.model) == ("shell", "shell")
    assert outcome.result.startswith("Ran 1 mechanical step(s)")


def test_it_rebuilds_the_registry_from_postgres_after_a_flush(repo, make_run, redis_client):
    live = make_run("coder")
    finished = make_run("reviewer")
    agent_run_execute(agent_run_id=finished.pk)

    redis_client.flushdb()
    entries = registry_list()

    assert [e["agent_run_id"] for e in entries] == [live.pk]
    assert entries[0]["status"] == "pending"


def test_it_names_file_line_and_field_of_a_malformed_role(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nsystem_prompt: hi\nmax_turns: -3\n")

    with pytest.raises(InvalidDefinition, match=r"bad\.yaml:3: max_turns: a positive whole number"):
        roles_load(path)
    assert not Role.objects.filter(name="bad").exists()


def test_it_refuses_a_hostile_role_or_script_file_with_its_line(tmp_path, settings):
    dupe = tmp_path / "dupe.yaml"
    dupe.write_text("name: one\nsystem_prompt: hi\nname: two\n")
    with pytest.raises(InvalidDefinition, match=r"dupe\.yaml:3: key 'name' appears twice"):
        roles_load(dupe)
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(
        "name: s\nturns:\n  - &a {text: lol}\n"
        + "".join(f"  - &{n} [" + ",".join([f"*{p}"] * 9) + "]\n" for p, n in zip("abcdef", "bcdefg", strict=True))
    )  # fmt: skip
    with pytest.raises(InvalidDefinition, match=r"bomb\.yaml:\d+: aliases would expand"):
        script_parse(bomb)
    settings.IMPORT_MAX_BYTES = 1024
    with pytest.raises(InvalidDefinition, match=r"^/dev/zero: larger than the import limit"):
        roles_load(Path("/dev/zero"))
    assert not Role.objects.filter(name__in=["one", "two"]).exists()


def test_it_names_file_line_and_field_of_a_malformed_script(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: s\nturns:\n  - text: hi\n  - tools: {write_file: 3}\n")

    with pytest.raises(InvalidDefinition, match=r"bad\.yaml:4: turns\.1\.tools: a list"):
        script_parse(path)


def test_it_picks_the_most_specific_script():
    def run(role: str, labels: tuple[str, ...]) -> RunInfo:
        return RunInfo(
            agent_run_id=1, agent_id="x", role=role, attempt=1, quantum_id=1, labels=labels
        )

    assert script_for(run("coder", ())).name == "coder"
    assert script_for(run("reviewer", ())).name == "verdict"
    assert script_for(run("janitor", ())).name == "default"
    assert script_for(run("planner", ("spawn",))).name == "planner-spawn"
    assert script_for(run("coder", ("flaky",))).name == "flaky"
    assert script_for(run("coder", ("flaky", "script:fail"))).name == "fail"


def test_it_lists_roles_and_runs_one_agent_from_the_command_line(repo, make_quantum, capsys):
    quantum = make_quantum()

    call_command("psychonaut", "roles")
    call_command("psychonaut", "run", "--role", "coder", "--quantum", str(quantum.pk))

    out = capsys.readouterr().out
    for role in ["planner", "coder", "reviewer", "tester", "security"]:
        assert role in out
    assert "→ write_file" in out
    assert "Running the tests." in out
    assert "== done" in out


def test_it_keeps_secrets_out_of_the_shell(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-very-secret")
    result = tool_execute(_ctx(tmp_path), "shell", {"command": "echo key=$ANTHROPIC_API_KEY"}, [])

    assert not result.is_error
    assert "sk-very-secret" not in result.output
    assert os.environ["ANTHROPIC_API_KEY"] == "sk-very-secret"


def test_it_commits_with_the_full_sha_and_maintains_the_repository_now_and_then(repo, monkeypatch):
    from psychonauts.workspaces import worktrees as workspaces

    monkeypatch.setattr(workspaces, "MAINTENANCE_EVERY", 1)  # every commit runs it
    path = workspaces.workspace_ensure(quantum_id=7)
    assert workspaces.workspace_commit(workspace=path, quantum_id=7, agent_id="a", role="r") == ""
    shas = []
    for n in range(3):
        (path / f"f{n}.txt").write_text(str(n))
        shas.append(workspaces.workspace_commit(workspace=path, quantum_id=7, agent_id="a",
                                                role="coder"))  # fmt: skip
    head = git("rev-parse", "HEAD", cwd=path)
    assert shas[-1] == head and len(head) == 40
    log = git("log", "--format=%H %s", "-3", cwd=path).splitlines()
    assert [line.split(" ", 1)[0] for line in log] == shas[::-1]
    assert all(line.endswith("q-7: a (coder)") for line in log)


def test_a_new_branch_s_worktree_is_one_git_knows_and_checks_out_like_its_own(repo):
    from psychonauts.workspaces import worktrees as workspaces

    path = workspaces.workspace_ensure(quantum_id=7)

    branch = branch_for(7)
    head = git("rev-parse", "HEAD", cwd=repo)
    assert git("symbolic-ref", "HEAD", cwd=path) == f"refs/heads/{branch}"
    assert git("rev-parse", "HEAD", cwd=path) == head
    assert git("status", "--porcelain", cwd=path) == ""
    assert (path / "calc.py").read_text() == (repo / "calc.py").read_text()
    listed = git("worktree", "list", "--porcelain", cwd=repo)
    assert f"worktree {path}\nHEAD {head}\nbranch refs/heads/{branch}" in listed
    assert not (repo / ".git" / "worktrees" / "q-7" / "locked").exists()
    # git prunes nothing of it, and its own command refuses the branch a second time.
    git("worktree", "prune", cwd=repo)
    assert str(path) in git("worktree", "list", cwd=repo)
    twice = git_run("worktree", "add", str(path.parent / "again"), branch, cwd=repo)
    assert twice.returncode != 0 and "already" in twice.stderr


def test_a_worktree_that_cannot_be_added_says_why_and_leaves_no_record(repo, settings):
    from psychonauts.workspaces import worktrees as workspaces

    in_the_way = Path(settings.PSYCHONAUTS_WORKTREES) / "q-7"
    in_the_way.mkdir(parents=True)
    (in_the_way / "notes.txt").write_text("somebody's")

    with pytest.raises(WorkspaceError, match="already exists"):
        workspaces.workspace_ensure(quantum_id=7)

    assert (in_the_way / "notes.txt").read_text() == "somebody's"
    assert not (in_the_way / ".git").exists()
    assert not (repo / ".git" / "worktrees" / "q-7").exists()


def test_new_worktrees_go_on_while_another_add_is_half_way_and_a_prune_waits_for_it(repo):
    """git's own `worktree add` (an existing branch) fails reading another add's half-written
    record, and `git worktree prune` deletes such a record, failing the add that is writing it:
    the prune and retry wait until no other add is running. A new branch's worktree reads no
    other record, so it does not wait."""
    from psychonauts.workspaces import worktrees as workspaces

    made: list[Path] = []
    with worktree_being_added(repo) as other:
        fresh = workspaces.workspace_ensure(quantum_id=6)
        assert (fresh / ".git").is_file()
        git("branch", branch_for(7), cwd=repo)  # an earlier run's branch
        adding = threading.Thread(
            target=lambda: made.append(workspaces.workspace_ensure(quantum_id=7))
        )
        adding.start()
        adding.join(1.0)
        # Its add failed on the half-written record; its prune and retry wait for the other.
        assert adding.is_alive() and not made
    adding.join(10)
    assert made and (made[0] / ".git").is_file()
    assert (other / "locked").exists()  # still being added: the prune kept it


def test_the_sweep_removes_worktrees_of_closed_idle_quanta_and_keeps_their_branches(
    repo, make_quantum, make_run
):
    from psychonauts.runtime.sweep import workspaces_sweep
    from psychonauts.workspaces import worktrees as workspaces
    from quanta.services import quantum_close, quantum_reopen

    closed, still_open, busy = make_quantum(), make_quantum(), make_quantum()
    paths = {q.pk: workspaces.workspace_ensure(quantum_id=q.pk) for q in (closed, still_open, busy)}
    (paths[closed.pk] / "work.txt").write_text("done")
    sha = workspaces.workspace_commit(workspace=paths[closed.pk], quantum_id=closed.pk,
                                      agent_id="a", role="coder")  # fmt: skip
    for q in (closed, busy):
        quantum_close(quantum_id=q.pk, reason="done in a test")
    run = make_run(quantum=busy)
    AgentRun.objects.filter(pk=run.pk).update(status=AgentStatus.RUNNING)

    assert workspaces_sweep() == [closed.pk]

    assert not paths[closed.pk].exists()
    assert paths[still_open.pk].exists() and paths[busy.pk].exists()
    branch = branch_for(closed.pk)
    assert git("rev-parse", branch, cwd=repo) == sha
    listed = git("worktree", "list", "--porcelain", cwd=repo)
    assert str(paths[closed.pk]) not in listed
    busy_path = paths[busy.pk]
    AgentRun.objects.filter(pk=run.pk).update(status=AgentStatus.DONE)
    out = StringIO()
    call_command("psychonaut", "sweep", stdout=out)
    assert f"removed the worktrees of 1 closed quanta: #{busy.pk}" in out.getvalue()
    assert not busy_path.exists()
    # Reopened and run again: the branch is checked out anew, with its work, and kept.
    quantum_reopen(quantum_id=closed.pk, reason="one more thing")
    again = workspaces.workspace_ensure(quantum_id=closed.pk)
    assert (again / "work.txt").read_text() == "done"
    assert workspaces_sweep() == []
    assert again.exists()


def test_lock_files_stay_one_per_stripe_however_many_quanta_come_and_go(
    repo, settings, monkeypatch
):
    """A lock file cannot be deleted safely, so quanta share a fixed set of them; quanta that
    share a stripe still each get their worktree and commit."""
    from psychonauts.workspaces import repository
    from psychonauts.workspaces import worktrees as workspaces

    monkeypatch.setattr(repository, "LOCK_STRIPES", 2)
    locks = Path(settings.ANNIHILATION_HOME) / "locks"
    shas = []
    for quantum_id in (4, 6, 8, 5):  # three on stripe 0, one on stripe 1
        path = workspaces.workspace_ensure(quantum_id=quantum_id)
        (path / "note.txt").write_text(f"quantum {quantum_id}")
        shas.append(workspaces.workspace_commit(workspace=path, quantum_id=quantum_id,
                                                agent_id="a", role="coder"))  # fmt: skip
        assert workspaces.workspace_remove(quantum_id=quantum_id)
    assert all(len(sha) == 40 for sha in shas) and len(set(shas)) == 4
    names = sorted(p.name for p in locks.iterdir())
    assert [n for n in names if n.startswith("worktree-") and "worktrees-" not in n] == [
        "worktree-0.lock",
        "worktree-1.lock",
    ]
    assert len([n for n in names if n.startswith("commit-")]) <= 2


LOOPS = """
name: loops
match: {labels: [loops]}
turns:
  - tools:
      - write_file: {path: "one.txt", content: "1"}
  - tools:
      - write_file: {path: "two.txt", content: "2"}
      - list_dir: {}
  - text: "never reached"
"""


def test_a_run_stopped_at_max_turns_keeps_every_turn_and_tool_result_it_completed(
    repo, scripts, make_quantum, make_run
):
    # A turn's completion is written by the next turn's opening; a run that stops before that
    # turn opens writes it at its end.
    from psychonauts.models import AgentTurn

    scripts("loops", LOOPS)
    Role.objects.filter(name="coder").update(max_turns=2)
    run = make_run("coder", quantum=make_quantum(labels=["loops"]))

    outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "error"
    assert "max turns (2)" in outcome.error
    turns = list(AgentTurn.objects.filter(agent_run=run).order_by("index"))
    assert [(t.index, t.complete, len(t.tool_results)) for t in turns] == [
        (0, True, 1),
        (1, True, 2),
    ]
    calls = ToolCall.objects.filter(agent_run=run).order_by("id")
    assert [(c.name, c.completed, c.is_error) for c in calls] == [
        ("write_file", True, False),
        ("write_file", True, False),
        ("list_dir", True, False),
    ]


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own priority is Linux's")
def test_worktrees_are_made_at_a_lower_priority_than_the_agents_work():
    from psychonauts.workspaces.worktrees import PREPARE_NICE, _Preparer

    def niceness() -> tuple[int, str]:
        own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        child = subprocess.run(["nice"], capture_output=True, text=True, check=True).stdout
        return own, child.strip()

    base = os.getpriority(os.PRIO_PROCESS, 0)
    lower = min(base + PREPARE_NICE, 19)
    assert _Preparer.pool().submit(niceness).result(10) == (lower, str(lower))
    assert niceness() == (base, str(base))  # the rest of the process as it was


def test_a_worktree_still_queued_when_needed_is_made_by_the_agent_itself(repo):
    from concurrent.futures import Future

    from psychonauts.workspaces.worktrees import workspace_prepare, workspace_ready

    queued: Future[Path] = Future()  # no background thread has begun on it
    path = workspace_ready(queued, quantum_id=7)
    assert queued.cancelled() and (path / ".git").is_file()

    begun = workspace_prepare(quantum_id=8)
    begun.result(10)
    assert workspace_ready(begun, quantum_id=8) == begun.result()


READER = """
name: reader
match: {labels: [reader]}
turns:
  - tools:
      - read_file: {path: "calc.py"}
      - grep: {pattern: "def"}
  - text: "Read it."
"""
WRITER = """
name: writer
match: {labels: [writer]}
turns:
  - tools:
      - write_file: {path: "notes.md", content: "hello\\n"}
  - text: "Wrote it."
"""


def test_an_agent_that_only_read_commits_nothing_and_one_that_wrote_commits(
    repo, scripts, make_quantum, make_run
):
    from psychonauts.workspaces import worktrees as workspaces

    scripts("reader", READER)
    scripts("writer", WRITER)
    quantum = make_quantum(labels=["reader"])
    path = workspaces.workspace_ensure(quantum_id=quantum.pk)
    head = git("rev-parse", "HEAD", cwd=path)
    (path / "stray.txt").write_text("left by someone else\n")

    reader = make_run("coder", quantum=quantum)
    assert agent_run_execute(agent_run_id=reader.pk).status == "done"

    assert git("rev-parse", "HEAD", cwd=path) == head
    assert git("status", "--porcelain", cwd=path) == "?? stray.txt"
    assert not Event.objects.filter(type="committed", payload__agent_run_id=reader.pk).exists()

    quantum.labels = ["writer"]
    quantum.save(update_fields=["labels"])
    writer = make_run("coder", quantum=quantum)
    assert agent_run_execute(agent_run_id=writer.pk).status == "done"

    assert git("rev-parse", "HEAD~1", cwd=path) == head
    assert git("status", "--porcelain", cwd=path) == ""
    assert Event.objects.filter(type="committed", payload__agent_run_id=writer.pk).exists()
