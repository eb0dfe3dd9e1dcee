"""Agents and the Tether on a central repository: a real agent run's commit pushed from one
host, a stale execution's outcome left to its successor, an approved change merged there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from bursts.models import AgentRun, AgentStatus
from core.celery import app
from core.locks import RedisLock
from core.models import Event
from psychonauts.models import AgentTurn, ToolCall
from psychonauts.roles import roles_sync_defaults
from psychonauts.runtime.execute import agent_run_execute
from psychonauts.runtime.runs import agent_run_create
from psychonauts.workspaces.central import branch_push, fence_ref, wip_ref
from psychonauts.workspaces.git import git
from psychonauts.workspaces.repository import branch_for, repo_key, repo_local
from quanta.models import Quantum
from quanta.services import quantum_create
from repos.services import repository_default
from tests.hosts.conftest import Central, Host
from tests.polling import wait_for
from tests.tether.test_changes import finished_run
from tether.models import ChangeStatus, Reaching
from tether.services import change_approve, change_review_create, reaching_answer
from tether.services.merge_queue import merge_queue_run

pytestmark = pytest.mark.django_db

MakeHost = Callable[[str, Central], Host]

WRITES = """
name: central-writes
match: {labels: [central-writes]}
turns:
  - tools:
      - write_file: {path: "from-{agent_id}.txt", content: "written by {agent_id}\\n"}
  - sleep: %(sleep)s
    text: "Done."
"""


@pytest.fixture
def agent_settings(hosts_settings: Any, tmp_path: Path) -> Any:
    folder = tmp_path / "scripts"
    folder.mkdir()
    hosts_settings.PSYCHONAUTS_SCRIPT_DIRS = [*hosts_settings.PSYCHONAUTS_SCRIPT_DIRS, folder]
    hosts_settings.PSYCHONAUTS_PROVIDER = ""
    hosts_settings.PSYCHONAUTS_RETRY_BASE_S = 0.01
    hosts_settings.PSYCHONAUTS_TEXT_FLUSH_S = 0.0
    roles_sync_defaults()
    return hosts_settings


def _script(settings: Any, sleep: float) -> None:
    folder = Path(settings.PSYCHONAUTS_SCRIPT_DIRS[-1])
    (folder / "central-writes.yaml").write_text(WRITES % {"sleep": sleep}, encoding="utf-8")


def _quantum() -> Quantum:
    return quantum_create(title="Write a file", labels=["central-writes"])


def test_an_agent_run_on_one_host_lands_its_commit_centrally_and_the_next_sees_it(
    agent_settings: Any, make_host: MakeHost, daemon_central: Central
) -> None:
    _script(agent_settings, 0)
    a, b = make_host("a", daemon_central), make_host("b", daemon_central)
    quantum = _quantum()
    first = agent_run_create(quantum_id=quantum.pk, role="coder")
    with a.active():
        outcome = agent_run_execute(agent_run_id=first.pk)
    assert outcome.status == "done", outcome.error
    second = agent_run_create(quantum_id=quantum.pk, role="coder")
    with b.active():
        outcome = agent_run_execute(agent_run_id=second.pk)
    assert outcome.status == "done", outcome.error
    branch = branch_for(quantum.pk)
    names = git("ls-tree", "--name-only", branch, cwd=daemon_central.bare).split()
    assert {f"from-{first.agent_id}.txt", f"from-{second.agent_id}.txt"} <= set(names)
    subjects = daemon_central.log(branch)
    for run in (first, second):
        assert subjects.count(f"q-{quantum.pk}: {run.agent_id} (coder)") == 1
    # What each run reported as its commit is what the central branch holds.
    commits = [
        e.payload["sha"]
        for e in Event.objects.filter(topic__startswith="agent:", type="committed").order_by("id")
    ]
    assert commits[-1] == daemon_central.tip(branch)


def test_a_run_taken_over_elsewhere_pushes_nothing_and_records_no_end(
    agent_settings: Any, make_host: MakeHost, daemon_central: Central
) -> None:
    _script(agent_settings, 1.5)
    a = make_host("a", daemon_central)
    quantum = _quantum()
    run = agent_run_create(quantum_id=quantum.pk, role="coder")
    ref = fence_ref(run.agent_id)

    def take_over() -> None:
        """Another host's execution of the same agent: it moves the fence once A holds it."""
        deadline = time.monotonic() + 20
        while not daemon_central.tip(ref) and time.monotonic() < deadline:
            time.sleep(0.05)
        blob = subprocess.run(
            ["git", "hash-object", "-w", "--stdin"],
            input="host b's execution\n",
            cwd=daemon_central.bare,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        git("update-ref", ref, blob, cwd=daemon_central.bare)

    thief = threading.Thread(target=take_over)
    thief.start()
    with a.active():
        outcome = agent_run_execute(agent_run_id=run.pk)
    thief.join()
    assert outcome.status == "stale"
    assert AgentRun.objects.get(pk=run.pk).status == AgentStatus.RUNNING
    assert not daemon_central.tip(branch_for(quantum.pk))  # nothing of it landed
    stale = Event.objects.filter(topic=f"agent:{run.agent_id}", type="stale").get()
    assert "another execution holds the agent" in stale.payload["reason"]
    assert not Event.objects.filter(topic=f"agent:{run.agent_id}", type__in=["done", "error"])


def test_an_approved_change_is_merged_into_the_central_target(
    hosts_settings: Any, make_host: MakeHost, daemon_central: Central
) -> None:
    hosts_settings.TETHER_AUTO_MERGE_LOW_RISK = False
    hosts_settings.TETHER_VERIFY_COMMANDS = []
    a, b = make_host("a", daemon_central), make_host("b", daemon_central)
    quantum = quantum_create(title="A greeting")
    with a.active():
        run = finished_run(quantum, {"hello.txt": "hello\n"})
    before = daemon_central.tip("main")
    with b.active():  # reviewed, approved and merged on a host that never ran the quantum
        review = change_review_create(quantum_run_id=run.pk)
        assert review is not None and review.base == "main"
        assert review.head_sha == daemon_central.tip(branch_for(quantum.pk))
        change_approve(change_id=review.pk, by="op")
        report = merge_queue_run()
    assert report.merged == [review.pk]
    review.refresh_from_db()
    assert review.status == ChangeStatus.MERGED
    assert daemon_central.tip("main") == review.merge_sha
    assert git("rev-parse", f"{review.merge_sha}^1", cwd=daemon_central.bare) == before
    assert git("show", "main:hello.txt", cwd=daemon_central.bare) == "hello"


def test_a_target_push_naming_an_old_tip_is_refused(
    hosts_settings: Any, make_host: MakeHost, file_central: Central
) -> None:
    a = make_host("a", file_central)
    with a.active():
        tip = file_central.tip("main")
        clone = repo_local()
        later = git("commit-tree", f"{tip}^{{tree}}", "-p", tip, "-m", "later", cwd=clone)
        assert branch_push("moved", tip, expected="")  # a new branch: expected absent
        assert not branch_push("moved", later, expected="f" * 40)  # not where it is
        assert file_central.tip("moved") == tip
        assert branch_push("moved", later, expected=tip)
    assert file_central.tip("moved") == later


def test_the_merge_queue_has_one_consumer_among_hosts(
    db: None, hosts_settings: Any, make_host: MakeHost, file_central: Central
) -> None:
    a = make_host("a", file_central)
    with a.active():
        repository = repository_default().pk
        key = f"repo:{repo_key()}:merge-queue-{repo_key()}"
        with RedisLock(key, wait_s=0):  # another host's consumer holds the queue
            assert merge_queue_run(repository_id=repository).busy
        assert not merge_queue_run(repository_id=repository).busy


KILLED = """
name: central-killed
match: {labels: [central-killed]}
turns:
  - tools:
      - write_file: {path: "work-{agent_id}.txt", content: "the work\\n"}
  - sleep: 4
    text: "finished"
"""


def _execute_on_host_a_until(
    run: AgentRun, a: Host, central: Central, scripts: Path, until: Callable[[], bool]
) -> None:
    """Host A executes the run in a process of its own, SIGKILLed (with what it started) once
    `until()` holds."""
    db = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": settings.REDIS_URL,
        "ANNIHILATION_HOME": str(a.home),
        "ANNIHILATION_HOST": "a",
        "ANNIHILATION_REPO": central.url,
        "ANNIHILATION_SCRIPT_DIRS": str(scripts),
        "ANNIHILATION_PROVIDER": "",
    }
    host_a = subprocess.Popen(
        [sys.executable, "manage.py", "psychonaut", "execute", str(run.pk)],
        cwd=Path(settings.BASE_DIR),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(until, what="host A far enough", timeout=60)
    finally:
        os.killpg(host_a.pid, signal.SIGKILL)
        host_a.wait()


@pytest.mark.django_db(transaction=True)
def test_a_run_killed_on_one_host_starts_over_on_another_and_its_work_lands_once(
    agent_settings: Any, make_host: MakeHost, daemon_central: Central
) -> None:
    folder = Path(agent_settings.PSYCHONAUTS_SCRIPT_DIRS[-1])
    (folder / "central-killed.yaml").write_text(KILLED, encoding="utf-8")
    a, b = make_host("a", daemon_central), make_host("b", daemon_central)
    quantum = quantum_create(title="Work", labels=["central-killed"])
    run = agent_run_create(quantum_id=quantum.pk, role="coder")
    # Host A dies once the agent's file is written (uncommitted) in its worktree.
    _execute_on_host_a_until(
        run, a, daemon_central, folder,
        lambda: ToolCall.objects.filter(agent_run=run, completed=True).exists(),
    )  # fmt: skip
    assert (a.home / "worktrees" / f"q-{quantum.pk}" / f"work-{run.agent_id}.txt").exists()

    with b.active():
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    branch = branch_for(quantum.pk)
    assert git("show", f"{branch}:work-{run.agent_id}.txt", cwd=daemon_central.bare) == "the work"
    assert daemon_central.log(branch).count(f"q-{quantum.pk}: {run.agent_id} (coder)") == 1
    restarted = Event.objects.filter(topic=f"agent:{run.agent_id}", type="restarted").get()
    assert "earlier turns ran on a" in restarted.payload["reason"]
    # The first execution's turns stay recorded; the second's follow them.
    assert list(AgentTurn.objects.filter(agent_run=run).values_list("index", flat=True)) == [
        0,
        1,
        2,
    ]


@pytest.mark.django_db(transaction=True)
def test_a_run_killed_between_its_final_answer_and_its_push_starts_over_elsewhere(
    agent_settings: Any, make_host: MakeHost, daemon_central: Central
) -> None:
    folder = Path(agent_settings.PSYCHONAUTS_SCRIPT_DIRS[-1])
    (folder / "central-killed.yaml").write_text(KILLED.replace("sleep: 4", "sleep: 0"))
    a, b = make_host("a", daemon_central), make_host("b", daemon_central)
    quantum = quantum_create(title="Work", labels=["central-killed"])
    run = agent_run_create(quantum_id=quantum.pk, role="coder")
    with a.active():  # another holder of the quantum's push lock keeps host A's commit waiting
        name = f"central:commit:{repo_key()}:{quantum.pk}"
    with RedisLock(name, ttl_s=60, wait_s=0):
        _execute_on_host_a_until(
            run, a, daemon_central, folder,
            lambda: AgentTurn.objects.filter(agent_run=run, index=1, complete=True).exists(),
        )  # fmt: skip
    assert not daemon_central.tip(branch_for(quantum.pk))

    with b.active():
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert outcome.status == "done", outcome.error
    branch = branch_for(quantum.pk)
    assert git("show", f"{branch}:work-{run.agent_id}.txt", cwd=daemon_central.bare) == "the work"
    assert daemon_central.log(branch).count(f"q-{quantum.pk}: {run.agent_id} (coder)") == 1


ASKS = """
name: central-asks
match: {labels: [central-asks]}
turns:
  - tools:
      - write_file: {path: "before-{agent_id}.txt", content: "written before the question\\n"}
  - tools:
      - ask_tether: {question: "Keep the old API?", assumption: "keep it", timeout_s: 600}
  - tools:
      - write_file: {path: "after-{agent_id}.txt", content: "written after the answer\\n"}
  - text: "Done."
"""


def _asked_on_a(
    settings: Any, make_host: MakeHost, central: Central
) -> tuple[Host, Host, Quantum, AgentRun]:
    """Hosts a and b, and an agent that wrote a file on a, then asked the Tether there."""
    folder = Path(settings.PSYCHONAUTS_SCRIPT_DIRS[-1])
    (folder / "central-asks.yaml").write_text(ASKS, encoding="utf-8")
    a, b = make_host("a", central), make_host("b", central)
    quantum = quantum_create(title="Ask first", labels=["central-asks"])
    run = agent_run_create(quantum_id=quantum.pk, role="coder")
    with a.active():
        assert agent_run_execute(agent_run_id=run.pk).status == "waiting"
    return a, b, quantum, run


def _answered_on_b(run: AgentRun, b: Host) -> Any:
    """The operator answers; host b's execution is the resumed one (no worker here)."""
    reaching = Reaching.objects.get(agent_run=run, status="pending")
    assert reaching_answer(reaching_id=reaching.pk, text="drop it").resumed
    app.control.purge()
    with b.active():
        return agent_run_execute(agent_run_id=run.pk)


def test_an_agent_answered_on_another_host_goes_on_with_the_work_it_did_before_asking(
    agent_settings: Any, make_host: MakeHost, daemon_central: Central
) -> None:
    _, b, quantum, run = _asked_on_a(agent_settings, make_host, daemon_central)
    topic = f"agent:{run.agent_id}"
    aside = Event.objects.get(topic=topic, type="set_aside").payload["wip"]
    assert daemon_central.tip(wip_ref(run.agent_id)) == aside
    assert not daemon_central.tip(branch_for(quantum.pk))  # set aside, not committed

    outcome = _answered_on_b(run, b)

    assert outcome.status == "done", outcome.error
    branch = branch_for(quantum.pk)
    names = set(git("ls-tree", "--name-only", branch, cwd=daemon_central.bare).split())
    assert {f"before-{run.agent_id}.txt", f"after-{run.agent_id}.txt"} <= names
    assert daemon_central.log(branch).count(f"q-{quantum.pk}: {run.agent_id} (coder)") == 1
    restored = Event.objects.get(topic=topic, type="restored").payload
    assert restored == {**restored, "host": "a", "wip": aside}
    assert not Event.objects.filter(topic=topic, type="restarted").exists()


def test_an_agent_whose_set_aside_work_does_not_apply_starts_over(
    agent_settings: Any, make_host: MakeHost, daemon_central: Central
) -> None:
    """A sibling pushed a conflicting change to the same file while the agent waited."""
    a, b, quantum, run = _asked_on_a(agent_settings, make_host, daemon_central)
    with a.active():
        clone = repo_local()
        base = git("rev-parse", "origin/main", cwd=clone)
        blob = subprocess.run(
            ["git", "hash-object", "-w", "--stdin"], input="a sibling's version\n",
            cwd=clone, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        tree = subprocess.run(
            ["git", "mktree"], input=f"100644 blob {blob}\tbefore-{run.agent_id}.txt\n",
            cwd=clone, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        sibling = git("commit-tree", tree, "-p", base, "-m", "a sibling", cwd=clone)
        assert branch_push(branch_for(quantum.pk), sibling, expected="")

    outcome = _answered_on_b(run, b)

    restarted = Event.objects.get(topic=f"agent:{run.agent_id}", type="restarted")
    assert "does not apply here" in restarted.payload["reason"]
    # Its conversation begins again: it writes its file again and asks again.
    assert outcome.status == "waiting", outcome.error
    assert Reaching.objects.filter(agent_run=run, status="pending").count() == 1
