"""Improving: the scanners run over the target branch's tip and file improvement quanta. This
module is the one writer of Finding.

A pass (`scan_run`, one at a time: a second returns at once, busy):
1. reads the tip of the integration branch from git's objects (autopilot/scanners/tree.py) and
   runs the deterministic scanners on every tracked text file (TODO/FIXME/XXX/HACK comments,
   long functions); vendored, generated, binary and huge files are skipped;
2. runs settings.AUTOPILOT_SCAN_LINT_COMMAND and AUTOPILOT_SCAN_TEST_COMMAND (when set) through
   the command guard and in the agent sandbox, on a scratch copy of the tip: lint lines become
   findings, a failing test command one finding;
3. files what is new, one quantum per file and scanner, at most AUTOPILOT_SCAN_MAX_FILED a
   pass, and remembers every finding by its fingerprint (scanner, path, rule, message without
   numbers: not the line, so moved code keeps it).

Anti-oscillation: a finding is not filed again while the quantum filed for it is not closed
(nor is a new finding of the same file and scanner: it waits for that quantum), nor within
AUTOPILOT_FINDING_WINDOW_S of its last filing; a finding on a line that a merge into the target
branch wrote within that window is not filed (the change would revert a recent merge). Each
skipped finding keeps why (`Finding.skipped`).
"""

from __future__ import annotations

import hashlib
import logging
import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path, PurePosixPath

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from autopilot.events import scan_event
from autopilot.labels import filed_labels
from autopilot.models import Finding, HubState
from autopilot.scanners import (
    FILE_MAX_BYTES,
    ScanFinding,
    clean_text,
    decode,
    failing,
    is_binary,
    lint,
    long_functions,
    path_skipped,
    todo,
)
from autopilot.scanners.tree import (
    BlamedCommit,
    TreeError,
    blame_commits,
    blobs_read,
    merged_recently,
    tree_export,
    tree_files,
)
from core.redaction import redact
from psychonauts.containment.identities import SCANNER
from psychonauts.containment.sandbox import SandboxUnavailable, sandbox_run, workspace_own
from psychonauts.containment.verify import verify_command_problem
from psychonauts.environments.errors import EnvironmentProblem
from psychonauts.environments.services import workspace_environment
from psychonauts.errors import WorkspaceError
from psychonauts.workspaces.central import shared_lock_try
from psychonauts.workspaces.repository import repo_key, repo_local
from quanta.errors import QuantaError
from quanta.fields import VERIFY_COMMAND_MAX
from quanta.models import QuantumKind, QuantumStatus
from quanta.services import quantum_create
from repos.context import current, current_is_default, working_on_id
from repos.models import Repository
from repos.services import default_repository_id, repository_default
from tether.services.changes import sha_of, target_branch

logger = logging.getLogger(__name__)

PRIORITY = 3
# The scan runs as the scanners' own sandbox identity (no quantum's).
SANDBOX_QUANTUM = SCANNER
# Scanners in the order their findings are filed when a pass cannot file them all.
SCANNER_ORDER = (failing.SCANNER, lint.SCANNER, long_functions.SCANNER, todo.SCANNER)
LISTED_MAX = 50  # findings a quantum's body lists (the rest are counted)
TODO_CHECKS_MAX = 10  # verify commands of a TODO quantum (one per comment)

# Why a finding was not filed (ScanReport.skipped's keys).
SKIP_OPEN = "open"
SKIP_WINDOW = "window"
SKIP_RECENT_MERGE = "recent_merge"
SKIP_CAP = "cap"


@dataclass
class ScanReport:
    """What one pass did. `found`: findings seen; `filed`: findings filed (in `quanta`);
    `skipped`: findings not filed, by reason; `files_skipped`: files not scanned, by reason;
    `errors`: what could not run (a refused command, no sandbox), each for the operator."""

    sha: str = ""
    found: int = 0
    filed: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    quanta: list[int] = field(default_factory=list)
    files_skipped: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    busy: bool = False

    def as_data(self) -> dict[str, object]:
        return {
            "sha": self.sha,
            "found": self.found,
            "filed": self.filed,
            "skipped": dict(self.skipped),
            "quanta": list(self.quanta),
            "files_skipped": dict(self.files_skipped),
            "errors": list(self.errors),
            "busy": self.busy,
        }


def _repo() -> Path:
    return repo_local()


def scratch_path() -> Path:
    """Where lint and test commands run: a copy of the tip, made anew each pass."""
    return Path(settings.ANNIHILATION_HOME) / "scans" / repo_key()


def _target() -> tuple[str, str]:
    """(target branch, its sha); TreeError when there is none. Read through the Tether (the
    branch changes are merged into)."""
    try:
        branch = target_branch()
    except WorkspaceError as exc:  # a detached HEAD and no TETHER_TARGET_BRANCH
        raise TreeError(f"no target branch: {exc}") from None
    sha = sha_of(branch)
    if not sha:
        raise TreeError(f"target branch {branch!r} has no commit")
    return branch, sha


def _count(counts: dict[str, int], key: str, n: int = 1) -> None:
    counts[key] = counts.get(key, 0) + n


# What the deterministic scanners found in a blob, by (blob, file suffix, long-function limit),
# with the path left blank: a blob never changes, so a pass reads and parses only the files
# that changed since the last pass this process made. None: the blob is binary.
_BLOB_CACHE: dict[tuple[str, str, int], tuple[ScanFinding, ...] | None] = {}
BLOB_CACHE_MAX = 100_000


def _blob_scan(text: str, suffix: str, limit: int) -> tuple[ScanFinding, ...]:
    name = f"file{suffix}"
    return (
        *todo.todo_scan(name, text),
        *long_functions.long_functions_scan(name, text, limit=limit),
    )


def scan_files(sha: str, report: ScanReport) -> tuple[list[ScanFinding], set[str]]:
    """The deterministic scanners over every tracked file of commit `sha`; returns the findings
    and the paths of the tree (what a linter's output may name)."""
    files, unnamed = tree_files(_repo(), sha)
    if unnamed:
        _count(report.files_skipped, "unnamed", unnamed)
    paths = {f.path for f in files}
    limit = settings.AUTOPILOT_LONG_FUNCTION_LINES
    wanted: list[tuple[str, tuple[str, str, int]]] = []  # (path, cache key)
    for entry in files:
        why = path_skipped(entry.path) or ("huge" if entry.size > FILE_MAX_BYTES else "")
        if why:
            _count(report.files_skipped, why)
        else:
            wanted.append((entry.path, (entry.oid, PurePosixPath(entry.path).suffix, limit)))
    if len(_BLOB_CACHE) + len(wanted) > BLOB_CACHE_MAX:
        _BLOB_CACHE.clear()
    missing: dict[str, set[tuple[str, str, int]]] = {}
    for _, key in wanted:
        if key not in _BLOB_CACHE:
            missing.setdefault(key[0], set()).add(key)
    for oid, data in blobs_read(_repo(), list(missing)):
        binary = is_binary(data)
        text = "" if binary else decode(data)
        for key in missing[oid]:
            _BLOB_CACHE[key] = None if binary else _blob_scan(text, key[1], limit)
    found: list[ScanFinding] = []
    for path, key in wanted:
        cached = _BLOB_CACHE.get(key, ())
        if cached is None:
            _count(report.files_skipped, "binary")
            continue
        found.extend(replace(finding, path=path) for finding in cached)
    return found, paths


def _sandboxed(
    command: str, where: Path, report: ScanReport, what: str
) -> tuple[int, str, str] | None:
    """(exit status, why it stopped, output) of a scan command, or None when it could not run
    (the reason added to report.errors)."""
    problem = verify_command_problem(command)
    if problem:
        report.errors.append(
            f"{what} command {clean_text(command, 200)!r} is refused by the command guard: {problem}"
        )
        return None
    try:
        # The repository's environment of the scanned commit, as its verify commands have.
        environment = workspace_environment(where)
        result = sandbox_run(
            command,
            workspace=where,
            quantum_id=SANDBOX_QUANTUM,
            timeout_s=settings.VERIFY_TIMEOUT_S,
            environment=environment.mount() if environment is not None else None,
        )
    except (SandboxUnavailable, EnvironmentProblem, OSError) as exc:
        report.errors.append(f"{what} command could not run: {exc}")
        return None
    return result.returncode, result.stopped, f"{result.stdout}\n{result.stderr}"


def scan_commands(sha: str, paths: set[str], report: ScanReport) -> list[ScanFinding]:
    """The lint and test commands' findings, run on a scratch copy of commit `sha`."""
    lint_command = settings.AUTOPILOT_SCAN_LINT_COMMAND.strip()
    test_command = settings.AUTOPILOT_SCAN_TEST_COMMAND.strip()
    if not lint_command and not test_command:
        return []
    where = scratch_path()
    found: list[ScanFinding] = []
    try:
        if lint_command:
            ran = _in_copy(lint_command, sha, where, report, "lint")
            if ran is not None:
                found.extend(lint.lint_parse(ran[2], paths=paths, root=str(where.resolve())))
                if ran[1]:
                    report.errors.append(
                        f"lint command stopped early ({ran[1]}): findings may be missing"
                    )
        if test_command:
            ran = _in_copy(test_command, sha, where, report, "test")
            if ran is not None:
                finding = failing.failing_tests(
                    test_command, returncode=ran[0], stopped=ran[1], output=ran[2]
                )
                if finding is not None:
                    found.append(finding)
    finally:
        shutil.rmtree(where, ignore_errors=True)
    return found


def _in_copy(
    command: str, sha: str, where: Path, report: ScanReport, what: str
) -> tuple[int, str, str] | None:
    """A scan command run on a fresh copy of commit `sha` (what another command wrote there,
    caches or fixes, is not this one's tree); its output redacted."""
    try:
        tree_export(_repo(), sha, where)
    except (TreeError, OSError) as exc:
        report.errors.append(f"could not copy the target branch for the {what} command: {exc}")
        return None
    workspace_own(where, quantum_id=SANDBOX_QUANTUM)
    ran = _sandboxed(command, where, report, what)
    return None if ran is None else (ran[0], ran[1], redact(ran[2]))


@dataclass
class _Candidate:
    finding: ScanFinding
    fingerprint: str
    skip_key: str = ""
    skip_reason: str = ""


def _fingerprinted(findings: Sequence[ScanFinding]) -> list[_Candidate]:
    """Each finding with its fingerprint; identical findings of one file told apart by their
    order."""
    seen: dict[str, int] = {}
    out: list[_Candidate] = []
    for finding in findings:
        base = finding.fingerprint()
        occurrence = seen.get(base, 0)
        seen[base] = occurrence + 1
        out.append(_Candidate(finding, _of_repository(finding.fingerprint(occurrence))))
    return out


def _of_repository(fingerprint: str) -> str:
    """A fingerprint of the repository scanned: the same finding in another repository is
    another finding (the default repository's stay as they were)."""
    if current_is_default():
        return fingerprint
    key = f"{current().repository_id}:{fingerprint}".encode()
    return hashlib.sha256(key).hexdigest()[: len(fingerprint)]


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{int(seconds)}s"
    if seconds < 7200:
        return f"{int(seconds // 60)} min"
    if seconds < 172800:
        return f"{int(seconds // 3600)} h"
    return f"{int(seconds // 86400)} days"


def _judge(candidates: list[_Candidate], *, branch: str, sha: str, now: datetime) -> None:
    """Mark the candidates that must not be filed, with the reason."""
    window = timedelta(seconds=settings.AUTOPILOT_FINDING_WINDOW_S)
    known: dict[str, Finding] = {}
    prints = [c.fingerprint for c in candidates]
    for start in range(0, len(prints), 1000):
        for found in Finding.objects.filter(
            fingerprint__in=prints[start : start + 1000]
        ).select_related("quantum"):
            known[found.fingerprint] = found
    for candidate in candidates:
        row = known.get(candidate.fingerprint)
        if row is None:
            continue
        if row.quantum is not None and row.quantum.status != QuantumStatus.CLOSED:
            candidate.skip_key = SKIP_OPEN
            candidate.skip_reason = (
                f"quantum #{row.quantum_id} filed for it is still {row.quantum.status}"
            )
        elif row.filed_at is not None and now - row.filed_at < window:
            candidate.skip_key = SKIP_WINDOW
            candidate.skip_reason = (
                f"filed {_ago((now - row.filed_at).total_seconds())} ago (quantum "
                f"#{row.quantum_id}); not filed again within {_ago(window.total_seconds())}"
            )
    # A file with an open quantum of a scanner gets no second one from it: the new findings
    # wait for that quantum to close (two agents on one file's findings would collide). Files
    # of the repository scanned: another repository's file of the same path is another file.
    open_on: dict[tuple[str, str], int] = {}
    for scanner, path, quantum_id in (
        Finding.objects.filter(
            quantum__isnull=False,
            quantum__repository_id=current().repository_id or default_repository_id(),
        )
        .exclude(quantum__status=QuantumStatus.CLOSED)
        .values_list("scanner", "path", "quantum_id")
    ):
        open_on[(scanner, path)] = quantum_id
    for candidate in candidates:
        held = open_on.get((candidate.finding.scanner, candidate.finding.path))
        if held is not None and not candidate.skip_key:
            candidate.skip_key = SKIP_OPEN
            candidate.skip_reason = (
                f"quantum #{held} for this file's {candidate.finding.scanner} findings is still "
                "open: filed once it closes"
            )
    live = [c for c in candidates if not c.skip_key and c.finding.path and c.finding.line > 0]
    if not live or window.total_seconds() <= 0:
        return
    merged = merged_recently(_repo(), sha, now - window)
    blamed: dict[str, dict[int, BlamedCommit]] = {}
    # Only the files recent merges changed can hold a line one of them wrote.
    for candidate in (c for c in live if c.finding.path in merged.paths):
        path = candidate.finding.path
        if path not in blamed:
            blamed[path] = blame_commits(_repo(), sha, path)
        commit = blamed[path].get(candidate.finding.line)
        if commit is not None and commit.sha in merged.commits:
            candidate.skip_key = SKIP_RECENT_MERGE
            candidate.skip_reason = (
                f"line {candidate.finding.line} was written by {commit.sha[:10]} "
                f"({clean_text(commit.summary, 80)}), merged into {branch} within "
                f"{_ago(window.total_seconds())}: changing it would revert a recent merge"
            )


def _group_key(candidate: _Candidate) -> tuple[int, str, str]:
    scanner = candidate.finding.scanner
    order = SCANNER_ORDER.index(scanner) if scanner in SCANNER_ORDER else len(SCANNER_ORDER)
    return order, scanner, candidate.finding.path


def _title(scanner: str, path: str, n: int) -> str:
    s = "" if n == 1 else "s"
    where = path if len(path) <= 300 else "…" + path[-299:]
    if scanner == failing.SCANNER:
        return "Make the failing tests pass"
    if scanner == lint.SCANNER:
        return f"Fix {n} linter finding{s} in {where}"
    if scanner == long_functions.SCANNER:
        return f"Split {n} long function{s} in {where}"
    return f"Resolve {n} TODO/FIXME comment{s} in {where}"


def _acceptance(scanner: str, path: str) -> str:
    if scanner == failing.SCANNER:
        return (
            f"`{settings.AUTOPILOT_SCAN_TEST_COMMAND}` exits 0 on the integration branch: the "
            "code is fixed, not the tests weakened or skipped."
        )
    if scanner == lint.SCANNER:
        return (
            f"`{settings.AUTOPILOT_SCAN_LINT_COMMAND}` reports nothing for {path}: each finding "
            "listed is fixed in the code (not silenced), behaviour unchanged."
        )
    if scanner == long_functions.SCANNER:
        return (
            f"Each function listed is at most {settings.AUTOPILOT_LONG_FUNCTION_LINES} lines, "
            "split into well-named smaller functions; behaviour unchanged; the tests pass."
        )
    return (
        f"Each comment listed in {path} is resolved: what it asks for is done (or found "
        "unnecessary and explained in the change) and the comment is gone; the file stays."
    )


def _checks(scanner: str, path: str, findings: Sequence[ScanFinding]) -> list[str]:
    """Verify commands proving the fix, those the command guard allows."""
    commands: list[str] = []
    if scanner == failing.SCANNER:
        commands.append(settings.AUTOPILOT_SCAN_TEST_COMMAND)
    elif scanner == lint.SCANNER:
        program = '$1 == p || $1 == "./" p'
        # The linter in a subshell (it may be several commands), its standard output filtered
        # to this file's lines: empty once they are fixed. (`2>&1` after a subshell is refused
        # by the guard: a linter writing findings to stderr only is not checked this way.)
        commands.append(
            f'test -z "$( ({settings.AUTOPILOT_SCAN_LINT_COMMAND}) | '
            f'awk -F: -v p={shlex.quote(path)} {shlex.quote(program)})"'
        )
    elif scanner == todo.SCANNER:
        texts = list(dict.fromkeys(f.evidence for f in findings if f.evidence))
        for text in texts[:TODO_CHECKS_MAX]:
            commands.append(
                f'test "$(grep -c -F -e {shlex.quote(text)} -- {shlex.quote(path)})" = 0'
            )
    return [
        c
        for c in commands
        if c.strip() and len(c) <= VERIFY_COMMAND_MAX and not verify_command_problem(c)
    ]


def _body(scanner: str, path: str, findings: Sequence[ScanFinding], branch: str, sha: str) -> str:
    where = f" in `{path}`" if path else ""
    lines = [
        f"The autopilot's `{scanner}` scanner found this{where} on `{branch}` at {sha[:10]}:",
        "",
    ]
    if scanner == failing.SCANNER:
        lines.append("```\n" + findings[0].message + "\n```")
    else:
        for finding in findings[:LISTED_MAX]:
            rule = f" [{finding.rule}]" if scanner == lint.SCANNER and finding.rule else ""
            lines.append(f"- line {finding.line}{rule}: {finding.message}")
        if len(findings) > LISTED_MAX:
            lines.append(f"- … and {len(findings) - LISTED_MAX} more")
    lines += ["", "Line numbers are those of that commit: the code may have moved since."]
    return "\n".join(lines)


def _record(candidates: Sequence[_Candidate], now: datetime) -> None:
    """Remember every finding seen (upsert by fingerprint): where it is now, when it was seen,
    why it was not filed."""
    rows = [
        Finding(
            scanner=c.finding.scanner,
            path=c.finding.path,
            line=c.finding.line,
            rule=c.finding.rule[:200],
            message=c.finding.message,
            fingerprint=c.fingerprint,
            skipped=c.skip_reason,
            last_seen=now,
            first_seen=now,
        )
        for c in candidates
    ]
    for start in range(0, len(rows), 1000):
        Finding.objects.bulk_create(
            rows[start : start + 1000],
            update_conflicts=True,
            unique_fields=["fingerprint"],
            update_fields=["path", "line", "rule", "message", "skipped", "last_seen"],
        )


def _file_group(
    scanner: str, path: str, group: Sequence[_Candidate], *, branch: str, sha: str, now: datetime
) -> int:
    """One quantum for one file's findings of one scanner; returns its id."""
    findings = [c.finding for c in group]
    with transaction.atomic():
        quantum = quantum_create(
            title=_title(scanner, path, len(findings)),
            body=_body(scanner, path, findings, branch, sha),
            kind=QuantumKind.CHORE,
            priority=PRIORITY,
            labels=filed_labels(HubState.IMPROVING, "improvement", f"scan:{scanner}"),
            acceptance=_acceptance(scanner, path),
            verify_commands=_checks(scanner, path, findings),
        )
        Finding.objects.filter(fingerprint__in=[c.fingerprint for c in group]).update(
            quantum=quantum, filed_at=now, skipped=""
        )
        scan_event(
            "filed",
            {
                "quantum_id": quantum.pk,
                "scanner": scanner,
                "path": path,
                "findings": len(findings),
                "title": quantum.title,
            },
        )
    return quantum.pk


def scan_file(
    findings: Sequence[ScanFinding], *, branch: str, sha: str, report: ScanReport
) -> None:
    """File what is new among `findings` (at most AUTOPILOT_SCAN_MAX_FILED quanta), remember
    them all, and count what was filed and skipped in `report`."""
    now = timezone.now()
    candidates = _fingerprinted(findings)
    report.found += len(candidates)
    _judge(candidates, branch=branch, sha=sha, now=now)
    groups: dict[tuple[int, str, str], list[_Candidate]] = {}
    for candidate in candidates:
        if not candidate.skip_key:
            groups.setdefault(_group_key(candidate), []).append(candidate)
    chosen = sorted(groups)[: settings.AUTOPILOT_SCAN_MAX_FILED]
    for key in sorted(groups)[settings.AUTOPILOT_SCAN_MAX_FILED :]:
        for candidate in groups[key]:
            candidate.skip_key = SKIP_CAP
            candidate.skip_reason = (
                f"over the pass's limit of {settings.AUTOPILOT_SCAN_MAX_FILED} quanta: "
                "filed on a later pass"
            )
    for candidate in candidates:
        if candidate.skip_key:
            _count(report.skipped, candidate.skip_key)
    _record(candidates, now)
    for key in chosen:
        _, scanner, path = key
        try:
            quantum_id = _file_group(scanner, path, groups[key], branch=branch, sha=sha, now=now)
        except QuantaError as exc:
            report.errors.append(f"could not file {scanner} findings of {path!r}: {exc}")
            continue
        report.quanta.append(quantum_id)
        report.filed += len(groups[key])


def scan_run(*, repository_id: int | None = None) -> ScanReport:
    """One improving pass over the target branch's tip (busy when another pass runs), of one
    repository, filing its quanta there; None: the default repository."""
    if repository_id is None:
        return _scan_run()
    with working_on_id(repository_id):
        return _scan_run()


def scans_run() -> dict[str, ScanReport]:
    """A pass over every registered repository in turn, by name (the default one, made from
    ANNIHILATION_REPO when it has no row yet, among them)."""
    repository_default()
    return {
        repository.name: scan_run(repository_id=repository.pk)
        for repository in Repository.objects.filter(removed_at__isnull=True).order_by("pk")
    }


def _scan_run() -> ScanReport:
    report = ScanReport()
    with shared_lock_try(f"scan-{repo_key()}") as held:  # one pass at a time, on any host
        if not held:
            report.busy = True
            return report
        if not (_repo() / ".git").exists():
            report.errors.append(f"no target repository at {_repo()}")
            return report
        try:
            branch, sha = _target()
        except TreeError as exc:
            report.errors.append(str(exc))
            return report
        report.sha = sha
        scan_event("started", {"branch": branch, "sha": sha})
        try:
            findings, paths = scan_files(sha, report)
            findings.extend(scan_commands(sha, paths, report))
            scan_file(findings, branch=branch, sha=sha, report=report)
        except TreeError as exc:
            report.errors.append(str(exc))
        scan_event("finished", {"branch": branch, **report.as_data()})
        logger.info(
            "scan of %s at %s: %d found, %d filed in %d quanta",
            branch, sha[:10], report.found, report.filed, len(report.quanta),
            extra={"sha": sha, "quanta": report.quanta},
        )  # fmt: skip
        return report
