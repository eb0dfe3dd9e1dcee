"""Building repositories' environments and finding the one a command runs in.

An environment is keyed by the hash of its declaration and of its key files' content at a
commit (`git ls-tree`: the blobs' ids are their content's hash). Its folder,
`settings.ENV_ROOT / key`, is built once per host:

- the row (host, key) says where it stands: building -> ready | failed (compare-and-set);
- the build runs under a file lock on the key, so concurrent requests build once: the others
  wait on the lock and find it ready (or failed) when they get it;
- setup runs in the sandbox as the builder's own uid, in a scratch folder holding only the key
  files (taken from the commit with `git archive`), with the environment's folder writable at
  ENV_MOUNT, network only through the egress proxy (allow-listed hosts), within a wall time, a
  per-file size limit and a total size limit;
- it is built in a staging folder renamed into place only when every setup command passed: a
  failed, timed-out or interrupted build leaves nothing that is ever mounted;
- its log is stored redacted; a failed build stays failed (its agents do not start) until the
  operator rebuilds it or the declaration or key files change (a new key).

Stale folders are removed by age and count (`environments_prune`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import logging
import os
import re
import shutil
import socket
import subprocess
import tarfile
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from core.redaction import redact
from core.safeyaml import InputRefused, read_text
from psychonauts.containment.sandbox import (
    SandboxEnvironment,
    SandboxUnavailable,
    builder_uid,
    sandbox_run,
)
from psychonauts.environments.errors import (
    EnvironmentBuildFailed,
    EnvironmentInvalid,
    EnvironmentNotFound,
    EnvironmentProblem,
    EnvironmentWait,
)
from psychonauts.environments.models import BuildStatus, EnvironmentBuild, EnvironmentWaiter
from psychonauts.environments.spec import (
    DECLARATION_PATH,
    EnvironmentSpec,
    spec_choose,
    spec_from_data,
    spec_parse,
)
from psychonauts.events import environment_event
from psychonauts.workspaces.central import base_branch, tracking
from psychonauts.workspaces.git import git_command, git_run
from psychonauts.workspaces.repository import file_lock, file_lock_try, repo_local, repo_url
from repos.context import current

logger = logging.getLogger(__name__)

LOG_MAX = 200_000  # characters of a build's log kept (its end: where it failed)
# A ready folder unused this long may go when there are more than ENV_KEEP: a command started
# on it a moment ago may still be reading it.
PRUNE_GRACE = timedelta(hours=1)
USED_EVERY = timedelta(minutes=1)  # used_at is written at most this often


@dataclass(frozen=True)
class Environment:
    """A ready environment: what a command needs to run in it."""

    build_id: int
    key: str
    folder: Path
    spec: EnvironmentSpec

    def mount(self) -> SandboxEnvironment:
        return SandboxEnvironment(
            folder=self.folder, path=self.spec.path, variables=self.spec.variables
        )


def host_name() -> str:
    return socket.gethostname()


def _git_bytes(repo: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    command = git_command(*args, cwd=repo)
    return subprocess.run(
        command.argv, cwd=repo, env=command.env, capture_output=True, check=False, timeout=120
    )


# A full commit id (SHA-1 or SHA-256): what is read at it never changes, so it is read once per
# process (a verify round, an agent's start and a merge-queue check each look the declaration
# up at the target branch's commit; reading it costs a git process each time).
_COMMIT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_CACHED_COMMITS = 256


@functools.lru_cache(maxsize=_CACHED_COMMITS)
def _declaration_blob(repo: str, sha: str) -> bytes | None:
    """The declaration file's bytes at commit `sha` (a full commit id), None when it has none."""
    proc = _git_bytes(Path(repo), "cat-file", "blob", f"{sha}:{DECLARATION_PATH}")
    return proc.stdout if proc.returncode == 0 else None


def spec_read(repo: Path, sha: str) -> EnvironmentSpec | None:
    """The repository's own declaration at commit `sha` (None when it has none)."""
    source = f"{DECLARATION_PATH}@{sha[:12]}"
    if _COMMIT_ID.fullmatch(sha):
        blob = _declaration_blob(str(repo), sha)
    else:  # a name that may move: read it now
        proc = _git_bytes(repo, "cat-file", "blob", f"{sha}:{DECLARATION_PATH}")
        blob = proc.stdout if proc.returncode == 0 else None
    if blob is None:
        return None
    if len(blob) > settings.IMPORT_MAX_BYTES:
        raise EnvironmentInvalid(f"{source}: larger than {settings.IMPORT_MAX_BYTES} bytes")
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError:
        raise EnvironmentInvalid(f"{source}: not UTF-8 text") from None
    return spec_parse(text, source=source)


def operator_spec() -> EnvironmentSpec | None:
    """The operator's declaration for the repository at hand: the one set on its row in the
    registry, else (ANNIHILATION_ENV_DECLARATION) a file's."""
    target = current()
    if target.environment:
        return spec_parse(target.environment, source=f"repository {target.name}")
    path = str(settings.ENV_DECLARATION)
    if not path:
        return None
    try:
        text = read_text(Path(path), limit=settings.IMPORT_MAX_BYTES)
    except InputRefused as exc:
        raise EnvironmentInvalid(exc.where(path)) from None
    except OSError as exc:
        raise EnvironmentInvalid(f"{path}: {exc.strerror}") from None
    return spec_parse(text, source=path)


def environment_key(repo: Path, sha: str, spec: EnvironmentSpec) -> str:
    """The hash of the declaration and of its key files' content at `sha` (a missing key file
    counts as missing: adding it changes the key)."""
    digest = hashlib.sha256(spec.digest().encode())
    if spec.key_files:
        if _COMMIT_ID.fullmatch(sha):
            listing = _key_files_listing(str(repo), sha, tuple(spec.key_files))
        else:
            listing = _key_files_read(str(repo), sha, tuple(spec.key_files))
        digest.update(b"\0" + listing)
    return digest.hexdigest()


def _key_files_read(repo: str, sha: str, key_files: tuple[str, ...]) -> bytes:
    proc = _git_bytes(Path(repo), "ls-tree", "-z", sha, "--", *key_files)
    if proc.returncode != 0:
        raise EnvironmentProblem(
            f"cannot read the key files at {sha[:12]}: {proc.stderr.decode(errors='replace')}"
        )
    return proc.stdout


# The key files' entries at a full commit id never change (a failure is not cached).
_key_files_listing = functools.lru_cache(maxsize=_CACHED_COMMITS)(_key_files_read)


def _commit_of(repo: Path, rev: str) -> str:
    proc = git_run("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", cwd=repo)
    if proc.returncode != 0:
        raise EnvironmentProblem(f"{rev!r} is not a commit of {repo}")
    return proc.stdout.strip()


def _target(repo: Path) -> str:
    """The head of the current repository's target branch: its own branch (as last fetched, for
    a central repository), else the central repository's HEAD branch or the checkout's HEAD."""
    if repo_url():
        return _commit_of(repo, tracking(base_branch()))
    return _commit_of(repo, current().target_branch or "HEAD")


def _ready(build: EnvironmentBuild, spec: EnvironmentSpec) -> Environment | None:
    folder = Path(settings.ENV_ROOT) / build.key
    if build.status != BuildStatus.READY or not folder.is_dir():
        return None
    now = timezone.now()
    if build.used_at is None or now - build.used_at > USED_EVERY:
        EnvironmentBuild.objects.filter(pk=build.pk).update(used_at=now)
    return Environment(build_id=build.pk, key=build.key, folder=folder, spec=spec)


def _failure(build: EnvironmentBuild) -> EnvironmentBuildFailed:
    return EnvironmentBuildFailed(
        f"the environment {build.key[:12]} failed to build: {build.error} "
        f"(`manage.py repos env log {build.pk}`)",
        build_id=build.pk,
    )


def _row(repo: Path, key: str, sha: str, spec: EnvironmentSpec) -> EnvironmentBuild:
    host = host_name()
    try:
        with transaction.atomic():
            build, _ = EnvironmentBuild.objects.get_or_create(
                host=host,
                key=key,
                defaults={"repository": str(repo), "commit_sha": sha, "spec": spec.as_data()},
            )
    except IntegrityError:  # another process inserted it between the get and the create
        build = EnvironmentBuild.objects.get(host=host, key=key)
    return build


@dataclass(frozen=True)
class Resolved:
    """The environment a commit's commands need: its key and declaration (no build yet)."""

    repo: Path
    sha: str
    key: str
    spec: EnvironmentSpec


def environment_resolve(
    repo: Path, *, sha: str, spec: EnvironmentSpec | None = None, declared_at: str = ""
) -> Resolved | None:
    """The environment of commit `sha`: the declaration in force (the operator's `spec`, else
    the repository's at `declared_at`, the target branch by default: an agent's commit changes
    what is installed through its key files, never the setup commands), keyed with the key
    files' content at `sha`. None when there is nothing to build."""
    if spec is None:
        at = declared_at or _target(repo)
        spec = spec_choose(spec_read(repo, at), operator_spec())
    if spec is None or not spec.setup:
        return None
    return Resolved(repo=repo, sha=sha, key=environment_key(repo, sha, spec), spec=spec)


def environment_ensure(
    repo: Path, spec: EnvironmentSpec | None = None, *, sha: str = "", declared_at: str = ""
) -> Environment | None:
    """The ready environment of commit `sha` (the target branch's head by default), built here
    first when it is not (this call waits for a build another process is running). None when
    the repository declares none. EnvironmentBuildFailed when its build failed."""
    repo = Path(repo)
    if not sha:
        sha = _target(repo)
    elif not _COMMIT_ID.fullmatch(sha):  # a name: the commit it names now
        sha = _commit_of(repo, sha)
    resolved = environment_resolve(repo, sha=sha, spec=spec, declared_at=declared_at)
    if resolved is None:
        return None
    return environment_build(resolved)


def environment_state(resolved: Resolved) -> tuple[EnvironmentBuild, Environment | None]:
    """Where the build of `resolved` stands, without building or waiting: its row (made,
    building, when missing) and the environment when it is ready."""
    build = _row(resolved.repo, resolved.key, resolved.sha, resolved.spec)
    return build, _ready(build, resolved.spec)


def environment_build(resolved: Resolved, *, rebuild: bool = False) -> Environment:
    """The ready environment of `resolved`, built now when it is not. `rebuild`: a failed build
    is tried again (the operator asked); otherwise it raises EnvironmentBuildFailed."""
    build = _row(resolved.repo, resolved.key, resolved.sha, resolved.spec)
    ready = _ready(build, resolved.spec)
    if ready is not None:
        return ready
    if build.status == BuildStatus.FAILED and not rebuild:
        raise _failure(build)
    with file_lock(f"env-{resolved.key}"):
        build.refresh_from_db()
        ready = _ready(build, resolved.spec)
        if ready is not None:
            return ready
        if build.status == BuildStatus.FAILED and not rebuild:
            raise _failure(build)
        return _build(build, resolved)


def _transition(build: EnvironmentBuild, expected: str, **fields: object) -> None:
    """A compare-and-set from `expected`; EnvironmentProblem when the row moved on."""
    moved = EnvironmentBuild.objects.filter(pk=build.pk, status=expected).update(**fields)
    if moved != 1:
        raise EnvironmentProblem(
            f"environment build {build.pk} is no longer {expected}; left as it is"
        )
    for name, value in fields.items():
        setattr(build, name, value)


def _end(build: EnvironmentBuild, **fields: object) -> None:
    """A build's last transition and the waking of the agents that waited on it, under the
    row's lock: an agent deciding to wait holds the same lock, so it either sees the build
    ended or is woken here."""
    with transaction.atomic():
        EnvironmentBuild.objects.select_for_update().filter(pk=build.pk).first()
        _transition(build, BuildStatus.BUILDING, **fields)
        _wake(build.pk)
        _announce(build)


def _announce(build: EnvironmentBuild) -> None:
    """The build's end as events the operator sees: built or failed (with its error), and
    each connection the proxy refused."""
    about = {"environment_build_id": build.pk, "key": build.key[:12],
             "repository": build.repository}  # fmt: skip
    if build.status == BuildStatus.READY:
        environment_event("environment_built", {**about, "size_bytes": build.size_bytes})
    else:
        environment_event("environment_failed", {**about, "error": build.error})
    for target in build.denied:
        environment_event("environment_denied", {**about, "target": target})


def _wake(build_id: int) -> None:
    from bursts.services.resume import agent_resume

    waiters = list(
        EnvironmentWaiter.objects.filter(build_id=build_id).values_list("agent_run_id", flat=True)
    )
    for agent_run_id in waiters:
        agent_resume(agent_run_id=agent_run_id)
    EnvironmentWaiter.objects.filter(build_id=build_id).delete()
    if waiters:
        logger.info("environment build %s woke %d agent(s)", build_id, len(waiters))


def _tree_size(folder: Path) -> int:
    total = 0
    for base, dirs, files in os.walk(folder):
        for name in (*dirs, *files):
            with contextlib.suppress(OSError):  # removed while counted
                total += (Path(base) / name).lstat().st_blocks * 512
    return total


def _fresh(folder: Path, uid: int | None) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(mode=0o755, parents=True)
    folder.chmod(0o755)
    if uid is not None:
        os.chown(folder, uid, uid)


def _sources(resolved: Resolved, where: Path, uid: int | None) -> None:
    """The key files at the commit, in the build's working folder (nothing else of the tree:
    the build depends on what its key says and on nothing more)."""
    if not resolved.spec.key_files:
        return
    listed = _git_bytes(resolved.repo, "ls-tree", "-z", "--name-only", resolved.sha, "--",
                        *resolved.spec.key_files)  # fmt: skip
    present = [p for p in listed.stdout.decode("utf-8", errors="replace").split("\0") if p]
    if not present:
        return
    proc = _git_bytes(resolved.repo, "archive", "--format=tar", resolved.sha, "--", *present)
    if proc.returncode != 0:
        raise EnvironmentProblem(f"git archive failed: {proc.stderr.decode(errors='replace')}")
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as archive:
        archive.extractall(where, filter="data")
    if uid is not None:
        for base, dirs, files in os.walk(where):
            for name in (*dirs, *files):
                os.lchown(Path(base) / name, uid, uid)


def _why(command: str, returncode: int, stopped: str, timeout_s: float) -> str:
    if stopped == "timeout":
        return f"setup timed out after {timeout_s:g}s in `{command}`"
    if stopped == "output":
        return f"`{command}` wrote more output than the sandbox keeps"
    if returncode == 153 or returncode == 128 + 25:  # SIGXFSZ
        return f"`{command}` wrote a file over the size limit"
    return f"`{command}` failed (exit status {returncode})"


def _build(build: EnvironmentBuild, resolved: Resolved) -> Environment:
    """Build `resolved` into its folder (the caller holds the key's lock)."""
    from psychonauts.environments.proxy import EgressProxy  # the proxy is only for builds

    spec = resolved.spec
    if build.status != BuildStatus.BUILDING:
        _transition(build, build.status, status=BuildStatus.BUILDING, error="", log="")
    root = Path(settings.ENV_ROOT)
    root.mkdir(parents=True, exist_ok=True)
    final, staging, work = (
        root / build.key,
        root / f".{build.key}.build",
        root / f".{build.key}.src",
    )
    shutil.rmtree(final, ignore_errors=True)  # a folder without a ready row: never trusted
    uid = builder_uid()
    _fresh(staging, uid)
    _fresh(work, uid)
    started = time.monotonic()
    limit = spec.timeout_s or float(settings.ENV_BUILD_TIMEOUT_S)
    _transition(build, BuildStatus.BUILDING, started_at=timezone.now(),
                commit_sha=resolved.sha, spec=spec.as_data())  # fmt: skip
    logger.info("environment build started", extra={"build": build.pk, "key": build.key})
    log: list[str] = []
    error = ""
    proxy = EgressProxy(allow=spec.network)
    try:
        _sources(resolved, work, uid)
        proxy.start()
        if uid is not None:
            os.chown(proxy.folder, uid, uid)
        mount = SandboxEnvironment(folder=staging, writable=True, path=spec.path,
                                   variables=(*spec.variables, *proxy.variables()),
                                   proxy=proxy.socket_path, prelude=proxy.bridge())  # fmt: skip
        for command in spec.setup:
            left = limit - (time.monotonic() - started)
            if left <= 0:
                error = f"setup timed out after {limit:g}s before `{command}`"
                break
            result = sandbox_run(
                f"umask 022\n{command}",
                workspace=work,
                quantum_id=0,
                timeout_s=left,
                environment=mount,
            )
            log.append(f"$ {command}\n{result.output.rstrip()}\n")
            if result.stopped or result.returncode != 0:
                error = _why(command, result.returncode, result.stopped, limit)
                break
            size = _tree_size(staging)
            if size > settings.ENV_MAX_BYTES:
                error = (
                    f"the environment grew to {size / 2**20:.1f} MB after `{command}`, over "
                    f"the limit of {settings.ENV_MAX_BYTES / 2**20:.0f} MB"
                )
                break
    except (SandboxUnavailable, EnvironmentProblem, OSError, tarfile.TarError) as exc:
        error = f"the build could not run: {exc}"
    finally:
        proxy.stop()
        shutil.rmtree(work, ignore_errors=True)
    denied = proxy.denied()
    if denied and error:
        error += f"; the proxy refused {', '.join(denied[:5])} (not in the allow-list)"
    text = redact("\n".join(log))[-LOG_MAX:]
    if error:
        shutil.rmtree(staging, ignore_errors=True)
        _end(build, status=BuildStatus.FAILED, error=error, log=text, denied=denied,
             finished_at=timezone.now())  # fmt: skip
        logger.warning("environment build failed: %s", error, extra={"build": build.pk})
        raise _failure(build)
    size = _tree_size(staging)
    staging.rename(final)
    now = timezone.now()
    _end(build, status=BuildStatus.READY, log=text, denied=denied, size_bytes=size,
         finished_at=now, used_at=now)  # fmt: skip
    logger.info("environment built", extra={"build": build.pk, "key": build.key, "bytes": size})
    environments_prune()
    return Environment(build_id=build.pk, key=build.key, folder=final, spec=spec)


def environments_prune(*, now: datetime | None = None) -> list[int]:
    """Remove this host's ready environments unused for ENV_KEEP_DAYS, and those beyond the
    ENV_KEEP most recently used (when unused for PRUNE_GRACE). Their rows go with them: a
    later request builds the key again. Returns the ids removed."""
    moment = timezone.now() if now is None else now
    rows = list(
        EnvironmentBuild.objects.filter(host=host_name(), status=BuildStatus.READY)
        .order_by("-used_at")
        .values_list("pk", "key", "used_at")
    )
    removed: list[int] = []
    for index, (pk, key, used_at) in enumerate(rows):
        age = moment - used_at if used_at else timedelta.max
        stale = age > timedelta(days=settings.ENV_KEEP_DAYS) or (
            index >= settings.ENV_KEEP and age > PRUNE_GRACE
        )
        # The row goes first (compare-and-set on ready), so no new command is given the
        # folder, then the folder.
        if stale and EnvironmentBuild.objects.filter(pk=pk, status=BuildStatus.READY).delete()[0]:
            shutil.rmtree(Path(settings.ENV_ROOT) / key, ignore_errors=True)
            removed.append(pk)
    return removed


def build_get(build_id: int) -> EnvironmentBuild:
    try:
        return EnvironmentBuild.objects.get(pk=build_id)
    except EnvironmentBuild.DoesNotExist:
        raise EnvironmentNotFound(f"no environment build {build_id}") from None


def environment_rebuild(build_id: int, *, failed_too: bool = True) -> Environment:
    """Build a build's key again from the commit and declaration it was made from (a failed
    one too, unless `failed_too` is False); a ready one is returned as it is."""
    return environment_build(_resolved_of(build_get(build_id)), rebuild=failed_too)


def _resolved_of(build: EnvironmentBuild) -> Resolved:
    spec = spec_from_data(build.spec, source=f"environment build {build.pk}")
    repo = Path(build.repository) if build.repository.startswith("/") else repo_local()
    return Resolved(repo=repo, sha=build.commit_sha, key=build.key, spec=spec)


def workspace_environment(workspace: Path, *, sha: str = "") -> Environment | None:
    """The ready environment a workspace's commands run in (its commit `sha`, its HEAD by
    default), for the default repository; built first when needed."""
    repo = repo_local()
    if not sha:
        head = git_run("rev-parse", "--verify", "--quiet", "HEAD", cwd=workspace)
        if head.returncode != 0:  # not a checkout of the repository: nothing to key on
            return None
        sha = head.stdout.strip()
    return environment_ensure(repo, sha=sha)


def environment_for_agent(*, agent_run_id: int, repo: Path) -> SandboxEnvironment | None:
    """The environment a starting agent's commands run in: the repository's at its target
    branch (an agent's own commit is verified in its own key's environment). None when the
    repository declares none. When it is not built yet the agent does not hold its worker:
    it is recorded as a waiter and suspended (waiting), a build task is sent, and
    EnvironmentWait is raised; the build's end resumes it. EnvironmentBuildFailed when the
    build failed: the agent does not start."""
    resolved = environment_resolve(repo, sha=_target(repo))
    if resolved is None:
        return None
    build, ready = environment_state(resolved)
    if ready is not None:
        return ready.mount()
    if build.status == BuildStatus.FAILED:
        raise _failure(build)
    from bursts.services.agent_runs import agent_run_wait

    with transaction.atomic():
        row = EnvironmentBuild.objects.select_for_update().get(pk=build.pk)
        ready = _ready(row, resolved.spec)
        if ready is not None:
            return ready.mount()
        if row.status == BuildStatus.FAILED:
            raise _failure(row)
        EnvironmentWaiter.objects.update_or_create(
            agent_run_id=agent_run_id, defaults={"build": row}
        )
        agent_run_wait(agent_run_id=agent_run_id, now=timezone.now())
        transaction.on_commit(lambda: _build_send(row.pk))
    raise EnvironmentWait(f"waiting for its repository's environment {row.key[:12]} to be built")


def _build_send(build_id: int) -> None:
    from core.celery import app

    app.send_task(BUILD_TASK, args=(build_id,))


BUILD_TASK = "psychonauts.tasks.build_environment"


def environment_build_queued(build_id: int) -> str:
    """The build task: build a row's key unless another process is building it (that one
    wakes the waiters), then wake whoever waits (a failed build wakes them to their error).
    Never waits on another builder: the worker is not held idle. Returns what happened."""
    build = EnvironmentBuild.objects.filter(pk=build_id).first()
    if build is None:
        return "gone"
    with file_lock_try(f"env-{build.key}") as held:
        if not held:
            return "built elsewhere"
        build.refresh_from_db()
        resolved = _resolved_of(build)
        if _ready(build, resolved.spec) is None and build.status != BuildStatus.FAILED:
            try:
                _build(build, resolved)  # wakes the waiters at its end
            except EnvironmentBuildFailed as exc:
                return f"failed: {exc}"
            return "ready"
        with transaction.atomic():
            EnvironmentBuild.objects.select_for_update().filter(pk=build_id).first()
            _wake(build_id)
        return str(build.status)


def environment_waiters_sweep() -> int:
    """Waiters whose build ended are woken (a lost wakeup); those whose build is still to do
    on this host with nobody holding its lock get the build task again (a lost task). Returns
    the number of builds acted on."""
    acted = 0
    host = host_name()
    for build_id, key, status in (
        EnvironmentBuild.objects.filter(waiters__isnull=False, host=host)
        .distinct()
        .values_list("pk", "key", "status")
    ):
        if status != BuildStatus.BUILDING:
            with transaction.atomic():
                EnvironmentBuild.objects.select_for_update().filter(pk=build_id).first()
                _wake(build_id)
            acted += 1
            continue
        with file_lock_try(f"env-{key}") as free:
            if free:
                transaction.on_commit(lambda b=build_id: _build_send(b))  # type: ignore[misc]
                acted += 1
    return acted


def _agent_denied(target: str) -> None:
    try:
        environment_event("agent_network_denied", {"target": target})
    finally:
        connection.close()  # the proxy's executor thread: no connection left open


def agent_sandbox_environment(environment: SandboxEnvironment | None) -> SandboxEnvironment | None:
    """An agent's commands' environment with the network the operator allows agents
    (ANNIHILATION_AGENT_NETWORK: hosts reached through the worker's egress proxy; none by
    default, and then `environment` as it is)."""
    hosts = tuple(settings.AGENT_NETWORK)
    if not hosts:
        return environment
    from psychonauts.environments.proxy import agents_proxy

    proxy = agents_proxy(hosts, _agent_denied)
    base = environment or SandboxEnvironment()
    return dataclasses.replace(
        base,
        variables=(*base.variables, *proxy.variables()),
        proxy=proxy.socket_path,
        prelude=proxy.bridge(),
    )
