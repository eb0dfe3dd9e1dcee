from __future__ import annotations

import json
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.urls import reverse

from core.access import viewer_ensure
from core.errors import BadSearchQuery
from core.events import publish
from core.models import Session
from core.search import sessions_search
from quanta.errors import BadSearchQuery as QuantaBadSearchQuery
from quanta.search import quanta_search

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


def agent_session(run_id: int, agent_id: str, *texts: str) -> Session:
    session = Session.objects.create(kind="agent_run", ref=str(run_id), title=f"run {agent_id}")
    for text in texts:
        publish(
            f"agent:{agent_id}",
            "text",
            {"agent_run_id": run_id, "text": text},
            session_id=session.pk,
        )
    return session


@pytest.fixture
def world() -> dict[str, Session]:
    return {
        "coder": agent_session(
            101,
            "7_s0_coder",
            "Running the migrations now",
            "The database migration failed with a lock timeout",
        ),
        "tester": agent_session(102, "7_s1_tester", "All tests passed; authentication works"),
        "other": agent_session(103, "8_cli_coder", "Refactored the authorization module"),
        "child": agent_session(104, "7_s0_coder.t2c0_reviewer", "Reviewed the migration plan"),
        "wave": _wave_session(),
    }


def _wave_session() -> Session:
    session = Session.objects.create(kind="wave", ref="5", title="wave 5")
    publish(
        "burst:events", "wave_started", {"note": "the migration wave starts"}, session_id=session.pk
    )
    return session


def ids(hits) -> set[int]:
    return {h.session_id for h in hits}


def test_it_stems_words(world):
    assert ids(sessions_search("migrating")) == {
        world["coder"].pk,
        world["child"].pk,
        world["wave"].pk,
    }


def test_it_matches_a_phrase_in_order(world):
    assert ids(sessions_search('"migration failed"')) == {world["coder"].pk}
    assert sessions_search('"failed migration"') == []


def test_it_takes_or_and_exclusion_and_prefixes(world):
    assert ids(sessions_search("lock OR refactored")) == {world["coder"].pk, world["other"].pk}
    # Exclusion is per event: the coder's other event about migrations still matches.
    coder = next(
        h for h in sessions_search("migration -timeout") if h.session_id == world["coder"].pk
    )
    assert coder.matches == 1 and "timeout" not in coder.snippet
    assert world["coder"].pk not in ids(sessions_search("migration -timeout -running"))
    assert ids(sessions_search("auth*")) == {world["tester"].pk, world["other"].pk}


def test_it_groups_events_by_session_with_the_agent(world):
    [hit] = sessions_search("migration failed")
    assert hit.session_id == world["coder"].pk
    assert hit.matches == 1
    assert (hit.agent_run_id, hit.agent_id, hit.quantum_id, hit.role) == (
        101,
        "7_s0_coder",
        7,
        "coder",
    )
    assert hit.topics == ["agent:7_s0_coder"]
    assert ("migration", True) in hit.snippet_parts and "[failed]" in hit.snippet
    both = next(h for h in sessions_search("migrations") if h.session_id == world["coder"].pk)
    assert both.matches == 2


def test_a_session_that_is_not_an_agent_run_has_no_agent(world):
    [hit] = sessions_search("wave starts")
    assert hit.kind == "wave" and hit.agent_run_id is None and hit.quantum_id is None


def test_it_ranks_by_relevance_then_recency(world):
    repeated = agent_session(105, "9_s0_coder", "deploy deploy deploy deploy the deploy")
    once = agent_session(106, "9_s1_coder", "deploy once")
    later = agent_session(107, "9_s2_coder", "deploy once")
    assert [h.session_id for h in sessions_search("deploy")] == [repeated.pk, later.pk, once.pk]
    assert len(sessions_search("deploy", limit=1)) == 1


def test_it_filters_by_topic_quantum_and_role(world):
    assert ids(sessions_search("migration*", topic="burst:events")) == {world["wave"].pk}
    assert ids(sessions_search("migration*", topic="agent:*")) == {
        world["coder"].pk,
        world["child"].pk,
    }
    assert ids(sessions_search("migration* OR auth*", quantum_id=7)) == {
        world["coder"].pk,
        world["child"].pk,
        world["tester"].pk,
    }
    assert sessions_search("migration*", quantum_id=70) == []
    assert ids(sessions_search("migration* OR auth*", role="coder")) == {
        world["coder"].pk,
        world["other"].pk,
    }
    [child] = sessions_search("migration*", role="reviewer")
    assert (child.quantum_id, child.role) == (7, "reviewer")


@pytest.mark.parametrize(
    "query", ["", "   ", "-", "OR", '""', "***", "-migration", "\x00", "a" * 5000]
)
def test_hostile_queries_are_refused_with_a_reason(world, query):
    with pytest.raises(BadSearchQuery):
        sessions_search(query)


@pytest.mark.parametrize(
    "query", ["the", "a\x00b", "x:* & | ! ( ) <-> '", "é" * 300, "' OR 1=1 --"]
)
def test_odd_queries_never_reach_the_database_as_errors(world, query):
    assert isinstance(sessions_search(query), list)


def test_hostile_filters_are_refused_or_match_nothing(world):
    with pytest.raises(BadSearchQuery):
        sessions_search("migration", role="coder$|.*")
    with pytest.raises(BadSearchQuery):
        sessions_search("migration", topic="a\x00")
    assert sessions_search("migration", topic="agent:%") == []


def test_quanta_search_keeps_its_own_error():
    with pytest.raises(QuantaBadSearchQuery):
        quanta_search(query="-only")


# --- CLI -----------------------------------------------------------------------------------


def run(*args: str) -> str:
    out = StringIO()
    call_command("sessions", *args, stdout=out)
    return out.getvalue()


def test_the_cli_prints_json(world):
    data = json.loads(run("search", "migration", "--role", "coder", "--json"))
    assert [d["session"] for d in data] == [world["coder"].pk]
    assert data[0]["agent_run"] == 101 and data[0]["quantum"] == 7 and data[0]["role"] == "coder"
    assert "[migration]" in data[0]["snippet"]
    assert "run 7_s0_coder" in run("search", "migration", "--quantum", "7")
    assert json.loads(run("search", "nothingmatches", "--json")) == []


def test_the_cli_refuses_a_bad_query_as_a_usage_error(world):
    with pytest.raises(CommandError, match="nothing to search for") as exc:
        run("search", "***")
    assert exc.value.returncode == 2


def _manage(*args: str) -> subprocess.CompletedProcess[str]:
    settings = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{settings['USER']}@{settings['HOST']}:{settings['PORT']}/{settings['NAME']}",
    }
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "sessions", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
        timeout=60,
    )


@pytest.mark.django_db(transaction=True)
def test_exit_codes_from_a_real_terminal():
    ok = _manage("search", "anything", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == []
    for args, message in [
        (["search", "--", "-excluded"], "at least one term"),
        (["search", "x", "--limit", "0"], "is not a positive number"),
        (["search", "x", "--quantum", "abc"], "is not an id"),
        (["search", "x", "--role", "a b"], "is not a role name"),
    ]:
        done = _manage(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)


# --- page ----------------------------------------------------------------------------------


def test_anonymous_users_are_sent_to_log_in(client):
    response = client.get("/sessions/?q=migration")
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_a_viewer_searches_and_follows_the_focus_link(client, world):
    client.force_login(viewer_ensure(username="viewer", password="pw-viewer"))
    empty = client.get(reverse("sessions"))
    assert empty.status_code == 200
    assert b'id="sessions-search"' in empty.content and b"sessions-results" not in empty.content
    assert b'id="nav-sessions"' in empty.content
    page = client.get(reverse("sessions"), {"q": '"migration failed"'})
    html = page.content.decode()
    assert page.status_code == 200
    assert reverse("focus", kwargs={"agent_run_id": 101}) in html
    assert "<mark>migration</mark>" in html and "run 7_s0_coder" in html
    assert reverse("focus", kwargs={"agent_run_id": 102}) not in html


def test_the_page_shows_a_bad_query_and_escapes_snippets(client, world):
    client.force_login(viewer_ensure(username="viewer", password="pw-viewer"))
    agent_session(110, "9_s0_coder", "<script>alert(1)</script> the injected marker & <b>Jerry</b>")
    bad = client.get(reverse("sessions"), {"q": "-"})
    assert bad.status_code == 200 and "nothing to search for" in bad.content.decode()
    page = client.get(reverse("sessions"), {"q": "injected"})
    assert b"<script>" not in page.content
    assert b"<mark>injected</mark> marker &amp;" in page.content
    none = client.get(reverse("sessions"), {"q": "zzzznothing"})
    assert b'id="sessions-none"' in none.content
