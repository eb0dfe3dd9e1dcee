from __future__ import annotations

import pytest

from core.models import Event
from quanta import services
from quanta.errors import (
    DependencyCycle,
    DependencyNotFound,
    DuplicateDependency,
    IllegalTransition,
    InvalidQuantum,
    QuantumNotFound,
)
from quanta.models import Comment, Dependency, Quantum, QuantumStatus
from tests.factories import make_chain, make_quantum

pytestmark = pytest.mark.django_db


def test_it_creates_a_quantum_with_clean_fields():
    q = services.quantum_create(
        title="  Add login  ", priority=1, labels=["auth", "auth", "web"], kind="feature"
    )
    q.refresh_from_db()
    assert q.title == "Add login"
    assert q.labels == ["auth", "web"]
    assert q.status == QuantumStatus.OPEN
    assert Event.objects.filter(topic="quanta", type="quantum_created").count() == 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"title": "  "}, "title: must not be empty"),
        ({"title": "x", "priority": 5}, "priority: must be 0..4"),
        ({"title": "x", "priority": "high"}, "priority: must be an integer"),
        ({"title": "x", "kind": "story"}, "kind: must be one of"),
        ({"title": "x", "complexity": "huge"}, "complexity: must be one of"),
        ({"title": "x", "labels": ["has space"]}, "labels:"),
    ],
)
def test_it_refuses_bad_fields_and_writes_nothing(fields, message):
    with pytest.raises(InvalidQuantum, match=message):
        services.quantum_create(**fields)
    assert Quantum.objects.count() == 0
    assert Event.objects.count() == 0


def test_it_refuses_an_unknown_parent():
    with pytest.raises(QuantumNotFound, match="#999"):
        services.quantum_create(title="child", parent_id=999)


def test_it_updates_fields_but_not_status():
    q = make_quantum()
    services.quantum_update(quantum_id=q.pk, changes={"title": "Renamed", "priority": 0})
    q.refresh_from_db()
    assert (q.title, q.priority, q.status) == ("Renamed", 0, "open")
    with pytest.raises(InvalidQuantum, match="status: not a field"):
        services.quantum_update(quantum_id=q.pk, changes={"status": "closed"})  # type: ignore[typeddict-unknown-key]


def test_it_refuses_a_parent_loop():
    epic = make_quantum("epic", kind="epic")
    child = make_quantum("child", parent_id=epic.pk)
    with pytest.raises(InvalidQuantum, match="descends from"):
        services.quantum_update(quantum_id=epic.pk, changes={}, parent_id=child.pk)


def test_it_closes_with_a_reason_and_reopens():
    q = make_quantum()
    services.quantum_close(quantum_id=q.pk, reason="done by hand")
    q.refresh_from_db()
    assert q.status == "closed" and q.close_reason == "done by hand" and q.closed_at
    services.quantum_reopen(quantum_id=q.pk, reason="not really done")
    q.refresh_from_db()
    assert q.status == "open" and q.close_reason == "" and q.closed_at is None
    assert q.comments.get().body == "Reopened: not really done"


def test_it_refuses_to_close_without_a_reason_or_twice():
    q = make_quantum()
    with pytest.raises(InvalidQuantum, match="reason"):
        services.quantum_close(quantum_id=q.pk, reason=" ")
    services.quantum_close(quantum_id=q.pk, reason="ok")
    with pytest.raises(IllegalTransition, match="it is closed"):
        services.quantum_close(quantum_id=q.pk, reason="again")


def test_it_leaves_an_in_progress_quantum_to_the_burst_manager():
    q = make_quantum()
    Quantum.objects.filter(pk=q.pk).update(status=QuantumStatus.IN_PROGRESS)
    with pytest.raises(IllegalTransition, match="in_progress"):
        services.quantum_close(quantum_id=q.pk, reason="operator")
    services.quantum_close(
        quantum_id=q.pk, reason="wave 1", allowed_from=frozenset({QuantumStatus.IN_PROGRESS})
    )
    assert Quantum.objects.get(pk=q.pk).status == "closed"


def test_it_defers_and_refuses_to_defer_a_closed_quantum():
    q = make_quantum()
    services.quantum_defer(quantum_id=q.pk)
    assert Quantum.objects.get(pk=q.pk).status == "deferred"
    services.quantum_close(quantum_id=q.pk, reason="dropped")
    with pytest.raises(IllegalTransition):
        services.quantum_defer(quantum_id=q.pk)


def test_it_reports_unknown_ids():
    with pytest.raises(QuantumNotFound, match="no quantum #42"):
        services.quantum_close(quantum_id=42, reason="x")
    with pytest.raises(QuantumNotFound):
        services.comment_add(quantum_id=42, body="hi", author="op")


def test_it_adds_and_removes_dependencies():
    a, b = make_quantum("a"), make_quantum("b")
    services.dependency_add(quantum_id=b.pk, depends_on_id=a.pk)
    assert Dependency.objects.filter(quantum=b, depends_on=a, kind="blocks").exists()
    with pytest.raises(DuplicateDependency):
        services.dependency_add(quantum_id=b.pk, depends_on_id=a.pk)
    services.dependency_remove(quantum_id=b.pk, depends_on_id=a.pk)
    with pytest.raises(DependencyNotFound):
        services.dependency_remove(quantum_id=b.pk, depends_on_id=a.pk)


def test_it_refuses_a_self_dependency():
    a = make_quantum()
    with pytest.raises(InvalidQuantum, match="itself"):
        services.dependency_add(quantum_id=a.pk, depends_on_id=a.pk)


def test_it_refuses_a_cycle_and_names_it():
    a, b, c = make_chain(3)
    with pytest.raises(DependencyCycle) as exc:
        services.dependency_add(quantum_id=a.pk, depends_on_id=c.pk)
    assert f"#{a.pk} -> #{c.pk} -> #{b.pk} -> #{a.pk}" in str(exc.value)
    assert not Dependency.objects.filter(quantum=a).exists()


def test_it_allows_cycles_among_non_blocking_edges():
    a, b = make_chain(2)
    services.dependency_add(quantum_id=a.pk, depends_on_id=b.pk, kind="related")
    assert Dependency.objects.filter(quantum=a, kind="related").exists()


def test_it_comments_and_makes_the_comment_searchable():
    q = make_quantum("Plain title")
    services.comment_add(quantum_id=q.pk, body="the flaky websocket reconnects", author="ada")
    assert Comment.objects.get(quantum=q).author == "ada"
    from quanta.search import quanta_search

    assert [h.quantum.pk for h in quanta_search(query="websockets")] == [q.pk]


def test_it_refuses_an_empty_comment():
    q = make_quantum()
    with pytest.raises(InvalidQuantum, match="comment"):
        services.comment_add(quantum_id=q.pk, body="  ", author="op")
