"""Reading the target repository at one commit, as the scanners need it: never from a worktree
agents write in, always from git's objects (a branch's tip is what was merged, whatever any
checkout holds).

- `tree_files`: the tracked regular files of a commit, with their sizes (`git ls-tree`);
- `blobs_read`: their contents, streamed through one `git cat-file --batch`;
- `tree_export`: the commit's files in a scratch folder (`git archive`), for commands;
- `merged_recently` and `blame_commits`: which lines recent merges wrote.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from psychonauts.workspaces.git import git_command

_SUBMODULE = "160000"
_SYMLINK = "120000"


class TreeError(Exception):
    """git could not read the commit."""


def _git(repo: Path, *args: str) -> bytes:
    command = git_command("-c", "core.quotepath=off", *args, cwd=repo)
    proc = subprocess.run(command.argv, cwd=repo, env=command.env, capture_output=True, check=False)
    if proc.returncode != 0:
        why = proc.stderr.decode("utf-8", "replace").strip()
        raise TreeError(f"git {' '.join(args[:3])} failed: {why}")
    return proc.stdout


@dataclass(frozen=True)
class TreeFile:
    path: str
    oid: str
    size: int


def tree_files(repo: Path, sha: str) -> tuple[list[TreeFile], int]:
    """The regular files of commit `sha` (symlinks and submodules left out), and how many paths
    were left out because their names are not UTF-8 (no check could name them)."""
    out = _git(repo, "ls-tree", "-r", "-z", "--long", "--full-tree", sha)
    files: list[TreeFile] = []
    unnamed = 0
    for entry in out.split(b"\x00"):
        if not entry:
            continue
        meta, _, raw_path = entry.partition(b"\t")
        fields = meta.split()
        if len(fields) != 4 or fields[1] != b"blob" or fields[0].decode() in (_SYMLINK, _SUBMODULE):
            continue
        try:
            path = raw_path.decode("utf-8")
        except UnicodeDecodeError:
            unnamed += 1
            continue
        if any(ord(ch) < 32 for ch in path):
            unnamed += 1
            continue
        size = int(fields[3]) if fields[3].isdigit() else 0
        files.append(TreeFile(path, fields[2].decode(), size))
    return files, unnamed


def blobs_read(repo: Path, oids: Iterable[str]) -> Iterator[tuple[str, bytes]]:
    """(oid, content) of each blob, in order, through one `git cat-file --batch` (a request
    written, its answer read: the pipes never fill)."""
    command = git_command("cat-file", "--batch", cwd=repo)
    proc = subprocess.Popen(
        command.argv,
        cwd=repo,
        env=command.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        for oid in oids:
            try:
                proc.stdin.write(oid.encode() + b"\n")
                proc.stdin.flush()
            except BrokenPipeError:
                raise TreeError("git cat-file ended early") from None
            line = proc.stdout.readline()
            if not line:
                raise TreeError("git cat-file ended early")
            header = line.split()
            if len(header) != 3:  # `<oid> missing`
                continue
            size = int(header[2])
            data = proc.stdout.read(size)
            proc.stdout.read(1)  # the newline after the content
            yield oid, data
    finally:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
        proc.stdout.close()
        proc.wait()


def tree_export(repo: Path, sha: str, dest: Path) -> None:
    """The files of commit `sha` in `dest` (emptied first). Entries that would land outside it
    (absolute or climbing links) are left out: tar's `data` filter."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    command = git_command("archive", "--format=tar", sha, cwd=repo)
    proc = subprocess.Popen(
        command.argv,
        cwd=repo,
        env=command.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as archive:
            for member in archive:
                try:
                    archive.extract(member, dest, filter="data")
                except (tarfile.FilterError, OSError):
                    continue
    finally:
        proc.stdout.close()
        err = proc.stderr.read().decode("utf-8", "replace").strip()
        proc.stderr.close()
        if proc.wait() != 0:
            raise TreeError(f"git archive {sha[:10]} failed: {err}")


@dataclass(frozen=True)
class RecentMerges:
    """What merges into the target brought in lately: their commits (the merge commits
    included: a conflict's resolution is theirs) and the files they changed."""

    commits: frozenset[str]
    paths: frozenset[str]


def merged_recently(repo: Path, target: str, since: datetime) -> RecentMerges:
    """The merges into `target`'s first-parent line since `since`."""
    cutoff = int(since.timestamp())
    # --since prunes the walk; the cut itself is on each merge's committer time.
    listed = _git(
        repo, "rev-list", "--first-parent", "--merges", "--format=%H %ct", f"--since=@{cutoff}",
        target,
    ).decode()  # fmt: skip
    merges = []
    for line in listed.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit() and int(parts[1]) > since.timestamp():
            merges.append(parts[0])
    commits: set[str] = set()
    paths: set[str] = set()
    for sha in merges:
        commits.update(c.decode() for c in _git(repo, "rev-list", f"{sha}^1..{sha}").split())
        changed = _git(repo, "diff", "--no-renames", "--name-only", "-z", f"{sha}^1", sha)
        paths.update(p.decode("utf-8", "replace") for p in changed.split(b"\x00") if p)
    return RecentMerges(frozenset(commits), frozenset(paths))


@dataclass(frozen=True)
class BlamedCommit:
    sha: str
    summary: str
    committed_at: int  # seconds since the epoch


def blame_commits(repo: Path, sha: str, path: str) -> dict[int, BlamedCommit]:
    """Which commit wrote each line of `path` at commit `sha` (`git blame --porcelain`)."""
    try:
        out = _git(repo, "blame", "--porcelain", sha, "--", path)
    except TreeError:
        return {}
    lines: dict[int, BlamedCommit] = {}
    commits: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    current_sha, final = "", 0
    for raw in out.split(b"\n"):
        if raw.startswith(b"\t"):
            info = commits.setdefault(current_sha, current)
            lines[final] = BlamedCommit(
                current_sha, info.get("summary", ""), int(info.get("committer-time", "0") or 0)
            )
            continue
        text = raw.decode("utf-8", "replace")
        head = text.split(" ")
        if len(head) >= 3 and len(head[0]) >= 40 and all(c in "0123456789abcdef" for c in head[0]):
            current_sha, final = head[0], int(head[2])
            current = commits.setdefault(current_sha, {})
        elif " " in text:
            key, value = text.split(" ", 1)
            if key in ("summary", "committer-time"):
                current[key] = value
    return lines
