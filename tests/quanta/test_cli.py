from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from quanta.models import Quantum
from tests.factories import make_chain, make_quantum

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> str:
    from io import StringIO

    out = StringIO()
    call_command("quanta", *args, stdout=out)
    return out.getvalue()


def run_json(*args: str):
    return json.loads(run(*args, "--json"))


def test_create_list_show_in_tables_and_json():
    out = run("create", "Write docs", "--priority", "1", "--label", "docs", "--kind", "chore")
    assert out.startswith("created #")
    created = run_json("create", "Second", "--body", "text")
    assert created["title"] == "Second" and created["priority"] == 2
    table = run("list")
    assert "Write docs" in table and "ID" in table.splitlines()[0]
    assert [q["title"] for q in run_json("list", "--label", "docs")] == ["Write docs"]
    assert [q["title"] for q in run_json("list", "--priority", "2")] == ["Second"]
    shown = run_json("show", str(created["id"]))
    assert shown["readiness"]["ready"] is True


def test_update_close_reopen_defer():
    q = make_quantum()
    assert run_json("update", str(q.pk), "--title", "New", "--label", "a", "--label", "b")[
        "labels"
    ] == ["a", "b"]
    assert run_json("close", str(q.pk), "--reason", "done")["status"] == "closed"
    assert run_json("reopen", f"#{q.pk}")["status"] == "open"
    assert run_json("defer", str(q.pk))["status"] == "deferred"
    assert run_json("list", "--status", "deferred")[0]["id"] == q.pk


def test_dep_comment_ready_blocked_search():
    a, b = make_quantum("alpha"), make_quantum("beta")
    assert "now depends on" in run("dep", "add", str(b.pk), str(a.pk))
    assert [q["id"] for q in run_json("ready")] == [a.pk]
    blocked = run_json("blocked")
    assert blocked[0]["quantum_id"] == b.pk and blocked[0]["waits_on"] == [a.pk]
    assert f"#{b.pk} 'beta' is not ready" in run("blocked")
    run("dep", "rm", str(b.pk), str(a.pk))
    assert len(run_json("ready")) == 2
    run("comment", str(a.pk), "remember the migration")
    assert [h["id"] for h in run_json("search", "migrations")] == [a.pk]
    assert "(none)" in run("search", "nothing-here")


def test_show_explains_a_chain():
    chain = make_chain(3)
    out = run("show", str(chain[2].pk))
    assert "is not ready" in out and f"start with #{chain[0].pk}" in out


def test_import_and_export(tmp_path):
    path = tmp_path / "q.yaml"
    path.write_text("- {ref: a, title: A}\n- {title: B, depends_on: [a]}\n")
    assert run_json("import", str(path))["imported"] == 2
    exported = run("export")
    assert "depends_on:" in exported and "title: B" in exported


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["show", "999"], "no quantum #999"),
        (["close", "999", "--reason", "x"], "no quantum #999"),
        (["create", ""], "title: must not be empty"),
        (["search", "--", "-x"], "at least one term"),
    ],
)
def test_domain_errors_become_one_clear_message(args, message):
    with pytest.raises(CommandError, match=message):
        run(*args)


def test_a_cycle_is_refused_by_the_cli():
    a, b = make_chain(2)
    with pytest.raises(CommandError, match="closes the cycle"):
        run("dep", "add", str(a.pk), str(b.pk))


def test_a_bad_import_reports_lines_and_writes_nothing(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("- title: ok\n- priority: 1\n")
    with pytest.raises(CommandError, match=r"bad.yaml:2: title: required"):
        run("import", str(path))
    assert Quantum.objects.count() == 0


def _manage(*args: str) -> subprocess.CompletedProcess[str]:
    settings = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{settings['USER']}@{settings['HOST']}:{settings['PORT']}/{settings['NAME']}",
    }
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "quanta", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
        timeout=60,
    )


@pytest.mark.django_db(transaction=True)
def test_exit_codes_from_a_real_terminal():
    ok = _manage("create", "From a shell", "--json")
    assert ok.returncode == 0, ok.stderr
    qid = json.loads(ok.stdout)["id"]
    usage = _manage("create", "x", "--priority", "9")
    assert usage.returncode == 2 and "priority is 0..4" in usage.stderr
    assert _manage("show", "abc").returncode == 2
    missing = _manage("show", "99999")
    assert missing.returncode == 1 and "no quantum #99999" in missing.stderr
    assert Quantum.objects.filter(pk=qid).exists()
    assert Quantum.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_hostile_arguments_from_a_real_terminal_get_one_line_and_no_traceback():
    cases = [
        (["create", "x", "--priority", "99999999999999999999"], 2, "priority is 0..4"),
        (["show", "99999999999999999999"], 2, "is not an id"),
        (["show", "٣"], 2, "is not an id"),
        (["list", "--limit", "1e9"], 2, "is not a positive number"),
        (["create", os.fsdecode(b"caf\xe9")], 2, "title: is not valid UTF-8"),
        (["import", "/dev/zero"], 1, "zero: larger than the import limit of 5.0 MiB"),
    ]
    for args, code, message in cases:
        done = _manage(*args)
        assert done.returncode == code, (args, done.stderr)
        assert message in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)
    assert Quantum.objects.count() == 0


def test_text_no_column_can_store_is_refused_with_its_field():
    with pytest.raises(CommandError, match="title: contains a NUL character") as exc:
        run("create", "a\x00b")
    assert exc.value.returncode == 2
    quantum = make_quantum("target")
    with pytest.raises(CommandError, match="author: 1 to 200 characters"):
        run("comment", str(quantum.pk), "hello", "--author", "x" * 201)
    assert Quantum.objects.count() == 1 and not quantum.comments.exists()


@pytest.mark.django_db
def test_it_prints_no_secret_whatever_the_data_holds(capsys):
    key = "sk-ant-api03-" + "Zq7" * 12
    quantum = make_quantum(title=f"rotate {key}", body=f"ANTHROPIC_API_KEY={key}")

    call_command("quanta", "show", str(quantum.pk))
    call_command("quanta", "list", "--json")

    out = capsys.readouterr().out
    assert key not in out and "sk-ant-…(redacted)" in out
