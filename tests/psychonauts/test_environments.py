"""Repositories' environments: a real repository whose tests need a package from a virtualenv,
built offline in the sandbox, mounted read-only into verify commands; bad declarations and
failing builds refused, with nothing half-built reused."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import shutil
import subprocess
import threading
import zipfile
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from pytest_django.fixtures import Settings as SettingsWrapper

from bursts.models import AgentRun, AgentStatus
from core.models import Event
from psychonauts.containment.sandbox import ENV_MOUNT, sandbox_run
from psychonauts.containment.verify import verify_commands_run
from psychonauts.environments.errors import EnvironmentBuildFailed, EnvironmentInvalid
from psychonauts.environments.models import BuildStatus, EnvironmentBuild, EnvironmentWaiter
from psychonauts.environments.proxy import host_allowed
from psychonauts.environments.services import (
    agent_sandbox_environment,
    environment_build_queued,
    environment_ensure,
    environment_rebuild,
    environment_resolve,
    environment_waiters_sweep,
    environments_prune,
    workspace_environment,
)
from psychonauts.environments.spec import DECLARATION_PATH, spec_parse
from psychonauts.models import ToolCall
from psychonauts.runtime.execute import agent_run_execute
from psychonauts.workspaces.git import git
from psychonauts.workspaces.worktrees import workspace_ensure
from repos.context import default_target, working_on

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing"),
    pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="no system python3"),
]

DECLARATION = """\
setup:
  - python3 -m venv /run/env/venv
  - /run/env/venv/bin/pip install --no-index --find-links wheels -r requirements.txt
key_files: [requirements.txt, wheels]
path: [venv/bin]
variables: {GREETING: hello}
timeout_s: 300
"""


def wheel(name: str, version: str, source: str) -> tuple[str, bytes]:
    """A pure-Python wheel of one module, made here (no network, no build backend)."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": source.encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return f"{name}-{version}-py3-none-any.whl", buffer.getvalue()


def commit_files(repo: Path, files: dict[str, str | bytes], message: str) -> str:
    for name, content in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", message, cwd=repo)
    return git("rev-parse", "HEAD", cwd=repo)


def python_project(repo: Path, *, version: str = "1.0", declaration: str = DECLARATION) -> str:
    """The demo repository made a project whose tests need `greetlib`, a package only the
    environment's virtualenv has."""
    name, data = wheel(
        "greetlib", version, f"VERSION = {version!r}\ndef greet(n):\n    return 'hi ' + n\n"
    )
    return commit_files(
        repo,
        {
            DECLARATION_PATH: declaration,
            "requirements.txt": f"greetlib=={version}\n",
            f"wheels/{name}": data,
            "test_greet.py": "import greetlib\n\nassert greetlib.greet('x') == 'hi x'\nprint('tests passed')\n",
        },
        "a python project",
    )


@pytest.fixture
def env_root(repo: Path, settings: SettingsWrapper, tmp_path: Path) -> Path:
    settings.ENV_ROOT = tmp_path / "home" / "environments"
    settings.ENV_DECLARATION = ""
    settings.ENV_BUILD_TIMEOUT_S = 300.0
    return Path(settings.ENV_ROOT)


def test_the_declaration_in_force_is_the_repository_s_own_target_branch(
    repo: Path, env_root: Path
) -> None:
    # The checkout's branch declares one setup; the branch the repository targets, another.
    head = commit_files(repo, {DECLARATION_PATH: "setup: ['echo from-head']\n"}, "head's setup")
    git("checkout", "-q", "-b", "release", cwd=repo)
    commit_files(repo, {DECLARATION_PATH: "setup: ['echo from-release']\n"}, "release's setup")
    git("checkout", "-q", "-", cwd=repo)
    target = dataclasses.replace(default_target(), name="other", target_branch="release")

    with working_on(target):
        resolved = environment_resolve(repo, sha=head)

    assert resolved is not None and resolved.spec.setup == ("echo from-release",)
    assert environment_resolve(repo, sha=head).spec.setup == ("echo from-head",)  # type: ignore[union-attr]


@pytest.mark.django_db(transaction=True)
def test_it_builds_a_virtualenv_offline_and_verify_commands_run_in_it(
    repo: Path, env_root: Path
) -> None:
    python_project(repo)
    workspace = workspace_ensure(quantum_id=3)
    # Without the environment the system's Python has no greetlib: the failure users met.
    bare = sandbox_run("python3 test_greet.py", workspace=workspace, quantum_id=3, timeout_s=30)
    assert bare.returncode != 0 and "No module named 'greetlib'" in bare.output

    environment = workspace_environment(workspace)
    assert environment is not None
    build = EnvironmentBuild.objects.get(pk=environment.build_id)
    assert build.status == BuildStatus.READY and build.size_bytes
    assert (
        environment.folder == env_root / build.key
        and (environment.folder / "venv/bin/python").exists()
    )

    report = verify_commands_run(
        ["python test_greet.py", "test \"$GREETING\" = hello", f"test \"$ANNIHILATION_ENV\" = {ENV_MOUNT}"],
        workspace=workspace, quantum_id=3,
    )  # fmt: skip
    assert report.passed, report.summary()
    assert "tests passed" in report.checks[0].output
    written = sandbox_run(f"touch {ENV_MOUNT}/venv/x", workspace=workspace, quantum_id=3,
                          timeout_s=30, environment=environment.mount())  # fmt: skip
    assert written.returncode != 0 and "Read-only file system" in written.output
    # Built once: a second request finds it ready.
    again = workspace_environment(workspace)
    assert again is not None and again.build_id == environment.build_id
    assert EnvironmentBuild.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_commit_that_changes_a_lockfile_is_verified_in_its_own_environment(
    repo: Path, env_root: Path
) -> None:
    first = python_project(repo, version="1.0")
    workspace = workspace_ensure(quantum_id=4)
    base = workspace_environment(workspace)
    name, data = wheel("greetlib", "2.0", "VERSION = '2.0'\ndef greet(n):\n    return 'hi ' + n\n")
    (workspace / "requirements.txt").write_text("greetlib==2.0\n")
    (workspace / "test_version.py").write_text(
        "import greetlib\nassert greetlib.VERSION == '2.0'\n"
    )
    (workspace / "wheels" / name).write_bytes(data)
    git("add", "-A", cwd=workspace)
    git("commit", "-q", "-m", "greetlib 2.0", cwd=workspace)
    changed = workspace_environment(workspace)
    assert base is not None and changed is not None and base.key != changed.key
    report = verify_commands_run(
        ["python test_version.py"],
        workspace=workspace, quantum_id=4,
    )  # fmt: skip
    assert report.passed, report.summary()
    # The target branch's commit still runs in its own.
    assert workspace_environment(workspace, sha=first) == base


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_for_one_key_build_it_once(repo: Path, env_root: Path) -> None:
    python_project(repo, declaration=DECLARATION.replace(
        "  - python3 -m venv", "  - echo built >> /run/env/count\n  - python3 -m venv"))  # fmt: skip
    results: list[object] = []

    def request() -> None:
        try:
            results.append(environment_ensure(repo))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=request) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    keys = {getattr(r, "key", None) for r in results}
    assert len(results) == 6 and len(keys) == 1 and None not in keys
    folder = env_root / keys.pop()  # type: ignore[operator]
    assert (folder / "count").read_text() == "built\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("setup: [a\n", "not valid YAML"),
        ("- just a list\n", "must be a mapping"),
        ("setup: [make]\nsetpu: 1\n", "unknown field(s) setpu"),
        ("setup: [make]\nkey_files: [../etc/passwd]\n", "relative path inside the repository"),
        ("setup: [make]\nvariables: {PATH: /x}\n", "PATH is set by the sandbox"),
        ("setup: [make]\nnetwork: ['evil host']\n", "is not a host name"),
        ("setup: [make]\ntimeout_s: -1\n", "positive number"),
    ],
)
def test_a_bad_declaration_is_refused_with_its_reason(text: str, expected: str) -> None:
    with pytest.raises(EnvironmentInvalid) as caught:
        spec_parse(text)
    assert expected in str(caught.value) and DECLARATION_PATH in str(caught.value)


@pytest.mark.django_db(transaction=True)
def test_a_declaration_that_is_not_yaml_in_the_repository_is_a_clear_error(
    repo: Path, env_root: Path
) -> None:
    commit_files(repo, {DECLARATION_PATH: "setup: [unclosed\n"}, "broken")
    with pytest.raises(EnvironmentInvalid, match=r"environment\.yaml@\w+:2: not valid YAML"):
        environment_ensure(repo)
    assert not EnvironmentBuild.objects.exists()


def failing(repo: Path, setup: str, **more: str) -> EnvironmentBuild:
    lines = "".join(f"{k}: {v}\n" for k, v in more.items())
    commit_files(
        repo,
        {DECLARATION_PATH: f"setup:\n  - echo partial > /run/env/half\n  - {setup}\n{lines}"},
        "x",
    )
    with pytest.raises(EnvironmentBuildFailed) as caught:
        environment_ensure(repo)
    build = EnvironmentBuild.objects.get()
    assert build.status == BuildStatus.FAILED and build.error in str(caught.value)
    return build


@pytest.mark.django_db(transaction=True)
def test_a_failing_setup_fails_the_build_with_its_redacted_log_and_nothing_is_reused(
    repo: Path, env_root: Path
) -> None:
    secret = "sk-ant-api03-" + "a1B2" * 20
    build = failing(repo, f"echo token {secret}; exit 3")
    assert "exit status 3" in build.error
    assert secret not in build.log and "token" in build.log
    assert not (env_root / build.key).exists()
    assert [p.name for p in env_root.iterdir()] == []  # no staging or source folder left
    # Asked again, it stays failed (agents do not start) until the operator rebuilds it.
    with pytest.raises(EnvironmentBuildFailed, match="exit status 3"):
        environment_ensure(repo)
    with pytest.raises(EnvironmentBuildFailed):
        environment_rebuild(build.pk)
    assert EnvironmentBuild.objects.get().status == BuildStatus.FAILED


@pytest.mark.django_db(transaction=True)
def test_a_setup_that_outlives_its_time_is_stopped(repo: Path, env_root: Path) -> None:
    build = failing(repo, "sleep 30", timeout_s="2")
    assert "timed out after 2s" in build.error
    assert not (env_root / build.key).exists()


@pytest.mark.django_db(transaction=True)
def test_a_setup_that_fills_the_disk_is_stopped(
    repo: Path, env_root: Path, settings: SettingsWrapper
) -> None:
    settings.ENV_MAX_BYTES = 2 * 2**20
    build = failing(repo, "head -c 5000000 /dev/zero > /run/env/big")
    assert "over the limit of 2 MB" in build.error
    settings.SANDBOX_FILE_BYTES = 2**20
    EnvironmentBuild.objects.all().delete()
    commit_files(repo, {"other": "x"}, "another key? no: same declaration, same key")
    build = failing(repo, "head -c 5000000 /dev/zero > /run/env/big2")
    assert "over the size limit" in build.error


@pytest.mark.django_db(transaction=True)
def test_a_host_outside_the_allow_list_is_refused_and_recorded(repo: Path, env_root: Path) -> None:
    script = "python3 -c \"import urllib.request; urllib.request.urlopen('https://example.com/', timeout=5)\""
    build = failing(repo, script, network="[pypi.org]")
    assert "example.com:443" in build.denied[0]
    assert "not in the allow-list" in build.error
    # The operator sees it on the dashboard's topic: the refused connection and the failure.
    seen = dict(Event.objects.filter(topic="burst:events").values_list("type", "payload"))
    assert seen["environment_denied"]["target"] == "example.com:443"
    assert seen["environment_failed"]["environment_build_id"] == build.pk


def test_the_allow_list_matches_names_and_subdomains() -> None:
    allow = ("pypi.org", "*.example.org")
    assert host_allowed("pypi.org", allow) and host_allowed("PyPI.org.", allow)
    assert host_allowed("a.example.org", allow)
    assert not host_allowed("example.org", allow) and not host_allowed("evilpypi.org", allow)
    assert not host_allowed("pypi.org.evil.com", allow)


@pytest.mark.django_db(transaction=True)
def test_stale_environments_are_removed_by_age_and_count(
    repo: Path, env_root: Path, settings: SettingsWrapper
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    keys = []
    for n in range(3):
        commit_files(repo, {DECLARATION_PATH: f"setup: ['echo {n} > /run/env/n']\n"}, f"decl {n}")
        environment = environment_ensure(repo)
        assert environment is not None
        keys.append(environment.key)
    old = timezone.now() - timedelta(hours=2)
    EnvironmentBuild.objects.filter(key=keys[0]).update(used_at=old - timedelta(days=30))
    EnvironmentBuild.objects.filter(key=keys[1]).update(used_at=old)
    settings.ENV_KEEP, settings.ENV_KEEP_DAYS = 1, 14.0
    removed = environments_prune()
    assert len(removed) == 2
    assert sorted(EnvironmentBuild.objects.values_list("key", flat=True)) == [keys[2]]
    assert not (env_root / keys[0]).exists() and (env_root / keys[2]).exists()


ENV_AGENT = """
name: env-agent
match: {labels: [env-agent]}
turns:
  - tools:
      - shell: {command: "python test_greet.py"}
  - text: "ran the tests"
"""


def test_an_agent_waits_for_its_environment_without_a_worker_and_runs_in_it(
    repo: Path, env_root: Path, scripts: Any, make_quantum: Any, make_run: Any
) -> None:
    python_project(repo)
    scripts("env-agent", ENV_AGENT)
    run = make_run("coder", quantum=make_quantum(labels=["env-agent"]))

    waiting = agent_run_execute(agent_run_id=run.pk)
    # The call returned: the worker is free while the environment is not built.
    assert waiting.status == "waiting" and "environment" in waiting.error
    run.refresh_from_db()
    waiter = EnvironmentWaiter.objects.get(agent_run_id=run.pk)
    assert run.status == AgentStatus.WAITING and waiter.build.status == BuildStatus.BUILDING
    assert not list(env_root.glob("[0-9a-f]*"))

    assert environment_build_queued(waiter.build_id) == "ready"
    run.refresh_from_db()
    assert run.status == AgentStatus.RUNNING and run.worker == ""  # resumed, its task sent
    assert not EnvironmentWaiter.objects.exists()

    done = agent_run_execute(agent_run_id=run.pk)
    assert done.status == "done", done.error
    call = ToolCall.objects.get(agent_run=run, name="shell")
    assert "tests passed" in call.output


def test_an_agent_does_not_start_when_its_environment_failed(
    repo: Path, env_root: Path, scripts: Any, make_quantum: Any, make_run: Any
) -> None:
    commit_files(repo, {DECLARATION_PATH: "setup: ['echo no registry; exit 7']\n"}, "broken setup")
    scripts("env-agent", ENV_AGENT)
    run = make_run("coder", quantum=make_quantum(labels=["env-agent"]))
    assert agent_run_execute(agent_run_id=run.pk).status == "waiting"
    build_id = EnvironmentWaiter.objects.get(agent_run_id=run.pk).build_id
    assert environment_build_queued(build_id).startswith("failed")
    ended = agent_run_execute(agent_run_id=run.pk)
    assert ended.status == "error" and "failed to build" in ended.error
    assert "exit status 7" in ended.error
    assert not ToolCall.objects.filter(agent_run=run).exists()


@pytest.mark.django_db(transaction=True)
def test_the_repos_env_commands_build_show_and_log(repo: Path, env_root: Path) -> None:
    from io import StringIO

    from django.core.management import CommandError, call_command

    secret = "sk-ant-api03-" + "c3D4" * 20
    commit_files(repo, {DECLARATION_PATH: f"setup: ['echo installing {secret}']\n"}, "decl")
    out = StringIO()
    call_command("repos", "env", "build", stdout=out)
    build = EnvironmentBuild.objects.get()
    assert f"environment {build.pk} ready" in out.getvalue()
    out = StringIO()
    call_command("repos", "env", "show", str(build.pk), stdout=out)
    assert "ready" in out.getvalue() and build.key in out.getvalue()
    out = StringIO()
    call_command("repos", "env", "log", str(build.pk), stdout=out)
    assert "installing" in out.getvalue() and secret not in out.getvalue()
    with pytest.raises(CommandError, match="no environment build 999"):
        call_command("repos", "env", "log", "999")


@pytest.mark.django_db(transaction=True)
def test_the_demo_repository_runs_its_real_tests_through_its_environment_offline(
    repo: Path, env_root: Path, settings: SettingsWrapper
) -> None:
    from annihilation.management.commands.demo import DEMO_VERIFY, demo_environment_env

    settings.TETHER_VERIFY_COMMANDS = []
    declaration = demo_environment_env()["ANNIHILATION_ENV_DECLARATION"]
    settings.ENV_DECLARATION = declaration
    assert demo_environment_env()["ANNIHILATION_TETHER_VERIFY_COMMANDS"] == DEMO_VERIFY
    workspace = workspace_ensure(quantum_id=5)
    passing = verify_commands_run([DEMO_VERIFY], workspace=workspace, quantum_id=5)
    assert passing.passed, passing.summary()
    assert "1 passed, 0 failed" in passing.checks[0].output
    # No network at all for this build: the allow-list is empty, and it built all the same.
    build = EnvironmentBuild.objects.get()
    assert build.spec["network"] == [] and build.status == BuildStatus.READY
    (workspace / "test_more.py").write_text("def test_sub():\n    assert 1 - 1 == 1\n")
    failing = verify_commands_run([DEMO_VERIFY], workspace=workspace, quantum_id=5)
    assert not failing.passed and "test_more.py::test_sub" in failing.checks[0].output


NODE_DECLARATION = """\
setup:
  - npm ci --offline --no-audit --no-fund
  - cp -r node_modules /run/env/node_modules
key_files: [package.json, package-lock.json, vendor]
variables: {NODE_PATH: /run/env/node_modules}
"""


@pytest.mark.skipif(shutil.which("npm") is None or shutil.which("node") is None, reason="no Node")
@pytest.mark.django_db(transaction=True)
def test_a_node_project_is_built_with_npm_ci_from_its_lockfile(
    repo: Path, env_root: Path, tmp_path: Path
) -> None:
    # A dependency packed into the repository: `npm ci` installs it from the lockfile offline.
    package = tmp_path / "greet"
    package.mkdir()
    (package / "package.json").write_text(
        '{"name": "greet", "version": "1.0.0", "main": "index.js"}'
    )
    (package / "index.js").write_text("module.exports = (n) => 'hi ' + n;\n")
    (repo / "vendor").mkdir()
    subprocess.run(["npm", "pack", str(package), "--pack-destination", str(repo / "vendor")],
                   check=True, capture_output=True, cwd=tmp_path)  # fmt: skip
    (repo / "package.json").write_text(
        '{"name": "app", "version": "1.0.0", "dependencies": {"greet": "file:vendor/greet-1.0.0.tgz"}}'
    )
    subprocess.run(["npm", "install", "--package-lock-only", "--offline", "--no-audit", "--no-fund"],
                   check=True, capture_output=True, cwd=repo)  # fmt: skip
    commit_files(
        repo,
        {DECLARATION_PATH: NODE_DECLARATION,
         "test.js": "const greet = require('greet');\nif (greet('x') !== 'hi x') process.exit(1);\nconsole.log('node tests passed');\n"},
        "a node project",
    )  # fmt: skip
    workspace = workspace_ensure(quantum_id=6)
    assert not (workspace / "node_modules").exists()
    report = verify_commands_run(["node test.js"], workspace=workspace, quantum_id=6)
    assert report.passed, report.summary()
    assert "node tests passed" in report.checks[0].output
    assert EnvironmentBuild.objects.get().status == BuildStatus.READY


def test_the_sweep_wakes_an_agent_left_waiting_on_a_build_that_ended(
    repo: Path, env_root: Path, scripts: Any, make_quantum: Any, make_run: Any
) -> None:
    python_project(repo)
    scripts("env-agent", ENV_AGENT)
    run = make_run("coder", quantum=make_quantum(labels=["env-agent"]))
    assert agent_run_execute(agent_run_id=run.pk).status == "waiting"
    build_id = EnvironmentWaiter.objects.get(agent_run_id=run.pk).build_id
    # Built by someone whose wakeup was lost: the waiter is still there.
    environment_rebuild(build_id)
    AgentRun.objects.filter(pk=run.pk).update(status=AgentStatus.WAITING)
    EnvironmentWaiter.objects.create(build_id=build_id, agent_run_id=run.pk)
    assert environment_waiters_sweep() == 1
    run.refresh_from_db()
    assert run.status == AgentStatus.RUNNING and not EnvironmentWaiter.objects.exists()


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
@pytest.mark.django_db(transaction=True)
def test_agents_reach_only_the_hosts_the_operator_allows_through_the_proxy(
    repo: Path, env_root: Path, settings: SettingsWrapper
) -> None:
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Hello(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"hello from the host")

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    workspace = workspace_ensure(quantum_id=8)
    curl = "curl -sS --max-time 10 -p -x http://127.0.0.1:3128 http://{}/"
    try:
        settings.AGENT_NETWORK = []
        assert agent_sandbox_environment(None) is None  # by default agents have no network
        settings.AGENT_NETWORK = ["localhost"]
        environment = agent_sandbox_environment(None)
        allowed = sandbox_run(curl.format(f"localhost:{port}"), workspace=workspace,
                              quantum_id=8, timeout_s=30, environment=environment)  # fmt: skip
        assert allowed.returncode == 0 and "hello from the host" in allowed.output
        denied = sandbox_run(curl.format("example.com"), workspace=workspace, quantum_id=8,
                             timeout_s=30, environment=environment)  # fmt: skip
        assert denied.returncode != 0 and "403" in denied.output
        targets = Event.objects.filter(type="agent_network_denied").values_list(
            "payload__target", flat=True
        )
        assert list(targets) == ["example.com:80"]
        # Straight out, without the proxy: nothing (the sandbox's own network namespace).
        direct = sandbox_run(f"curl -sS --max-time 5 --noproxy '*' http://localhost:{port}/", workspace=workspace,
                             quantum_id=8, timeout_s=30, environment=environment)  # fmt: skip
        assert direct.returncode != 0
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.django_db
def test_a_registered_repositorys_own_declaration_is_the_operators(
    repo: Path, settings: SettingsWrapper, tmp_path: Path
) -> None:
    """The declaration set on a repository's row wins over ANNIHILATION_ENV_DECLARATION, and
    only while the code works on that repository."""
    from psychonauts.environments.services import operator_spec
    from repos.context import working_on
    from repos.services import repository_default

    settings_file = tmp_path / "environment.yaml"
    settings_file.write_text("setup: [echo from-settings]\n")
    settings.ENV_DECLARATION = str(settings_file)
    repository = repository_default()
    repository.environment = "setup: [echo from-the-row]\n"

    with working_on(repository):
        spec = operator_spec()
    assert spec is not None and spec.setup == ("echo from-the-row",)
    assert spec.source == f"repository {repository.name}"
    outside = operator_spec()
    assert outside is not None and outside.setup == ("echo from-settings",)


class GitCount:
    """Counts the git processes started (every git process goes through subprocess.Popen)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.argvs: list[list[str]] = []
        counter = self

        class Counting(subprocess.Popen):
            def __init__(self, args: Any, *rest: Any, **kwargs: Any) -> None:
                if isinstance(args, list | tuple) and args and args[0] == "git":
                    counter.argvs.append([str(a) for a in args])
                super().__init__(args, *rest, **kwargs)

        monkeypatch.setattr(subprocess, "Popen", Counting)

    def take(self) -> list[list[str]]:
        taken, self.argvs = self.argvs, []
        return taken


def reads_of_the_declaration(argvs: list[list[str]]) -> int:
    return sum(1 for argv in argvs if "cat-file" in argv)


@pytest.mark.django_db(transaction=True)
def test_a_verify_round_reads_the_declaration_once_per_target_commit(
    repo: Path, env_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit_files(
        repo,
        {DECLARATION_PATH: "setup: [mkdir -p /run/env/bin]\nkey_files: [requirements.txt]\n",
         "requirements.txt": "nothing\n"},
        "an environment",
    )  # fmt: skip
    workspace = workspace_ensure(quantum_id=6)
    assert verify_commands_run(["true"], workspace=workspace, quantum_id=6).passed
    count = GitCount(monkeypatch)

    for _ in range(3):
        report = verify_commands_run(["true"], workspace=workspace, quantum_id=6)
        assert report.passed, report.summary()
        # The workspace's commit and the target branch's: the declaration and the key files
        # at a commit already read are not read again.
        assert len(count.take()) == 2

    # The target branch moves: its new commit's declaration is read once, then no more.
    commit_files(repo, {"README.md": "moved\n"}, "the target moves")
    count.take()
    verify_commands_run(["true"], workspace=workspace, quantum_id=6)
    assert reads_of_the_declaration(count.take()) == 1
    verify_commands_run(["true"], workspace=workspace, quantum_id=6)
    assert reads_of_the_declaration(count.take()) == 0
