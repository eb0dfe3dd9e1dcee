from __future__ import annotations

import pytest

from quanta import selectors, services
from quanta.errors import QuantumNotFound
from quanta.models import Quantum, QuantumStatus
from tests.factories import make_chain, make_quantum

pytestmark = pytest.mark.django_db


def ids(qs):
    return [q.pk for q in qs]


def test_ready_is_open_unblocked_by_priority_then_age():
    low = make_quantum("low", priority=3)
    high = make_quantum("high", priority=0)
    older_mid = make_quantum("mid 1", priority=2)
    newer_mid = make_quantum("mid 2", priority=2)
    assert ids(selectors.quanta_ready()) == [high.pk, older_mid.pk, newer_mid.pk, low.pk]


def test_ready_waits_for_every_blocker_to_close():
    a, b = make_quantum("a"), make_quantum("b")
    c = make_quantum("c", depends_on=[a.pk, b.pk])
    assert c.pk not in ids(selectors.quanta_ready())
    services.quantum_close(quantum_id=a.pk, reason="ok")
    assert c.pk not in ids(selectors.quanta_ready())
    services.quantum_close(quantum_id=b.pk, reason="ok")
    assert c.pk in ids(selectors.quanta_ready())


def test_ready_ignores_non_blocking_edges_and_excludes_other_statuses():
    a = make_quantum("a")
    b = make_quantum("b")
    services.dependency_add(quantum_id=b.pk, depends_on_id=a.pk, kind="related")
    deferred = make_quantum("deferred")
    services.quantum_defer(quantum_id=deferred.pk)
    busy = make_quantum("busy")
    Quantum.objects.filter(pk=busy.pk).update(status=QuantumStatus.IN_PROGRESS)
    assert ids(selectors.quanta_ready()) == [a.pk, b.pk]


def test_ready_scopes_by_labels_and_excludes_ids():
    web = make_quantum("web", labels=["frontend"])
    api = make_quantum("api", labels=["backend"])
    make_quantum("none")
    assert ids(selectors.quanta_ready(labels=["frontend", "backend"])) == [web.pk, api.pk]
    assert ids(selectors.quanta_ready(labels=["frontend", "backend"], exclude_ids=[web.pk])) == [
        api.pk
    ]


def test_why_not_ready_walks_blockers_transitively():
    a, b, c = make_chain(3)
    why = selectors.quantum_why_not_ready(quantum_id=c.pk)
    assert not why.ready
    assert why.direct == [b.pk]
    assert set(why.blockers) == {a.pk, b.pk}
    assert why.blockers[b.pk].waits_on == [a.pk]
    text = why.describe()
    assert f"start with #{a.pk}" in text and f"#{b.pk} 'step 1' [open]" in text


def test_why_not_ready_skips_closed_blockers_and_reports_status():
    a, b = make_chain(2)
    services.quantum_close(quantum_id=a.pk, reason="ok")
    assert selectors.quantum_why_not_ready(quantum_id=b.pk).ready
    services.quantum_defer(quantum_id=b.pk)
    why = selectors.quantum_why_not_ready(quantum_id=b.pk)
    assert not why.ready and "deferred" in why.reasons[0]


def test_why_not_ready_unknown_id():
    with pytest.raises(QuantumNotFound):
        selectors.quantum_why_not_ready(quantum_id=404)


def test_blocked_lists_waiting_and_quarantined_quanta():
    a, b = make_chain(2)
    q = make_quantum("quarantined")
    Quantum.objects.filter(pk=q.pk).update(status=QuantumStatus.BLOCKED)
    assert ids(selectors.quanta_blocked()) == [b.pk, q.pk]
    assert a.pk not in ids(selectors.quanta_blocked())


def test_children_of_an_epic():
    epic = make_quantum("epic", kind="epic")
    kids = [make_quantum(f"kid {i}", parent_id=epic.pk) for i in range(2)]
    make_quantum("stranger")
    assert ids(selectors.quanta_children(parent_id=epic.pk)) == [k.pk for k in kids]


def test_the_blocker_count_follows_every_path_that_changes_it():
    """open_blockers is kept by database triggers: check each path against the truth."""
    a, b = make_quantum("a"), make_quantum("b")
    c = make_quantum("c", depends_on=[a.pk, b.pk])

    def count():
        return Quantum.objects.get(pk=c.pk).open_blockers

    assert count() == 2
    services.quantum_close(quantum_id=a.pk, reason="ok")
    assert count() == 1
    services.quantum_reopen(quantum_id=a.pk)
    assert count() == 2
    services.dependency_remove(quantum_id=c.pk, depends_on_id=b.pk)
    assert count() == 1
    # An admin edit that turns the edge into a non-blocking one.
    from quanta.models import Dependency

    Dependency.objects.filter(quantum=c, depends_on=a).update(kind="related")
    assert count() == 0 and c.pk in ids(selectors.quanta_ready())
    Dependency.objects.filter(quantum=c, depends_on=a).update(kind="blocks")
    assert count() == 1
    # Deleting a blocker outright releases the quantum.
    Quantum.objects.filter(pk=a.pk).delete()
    assert count() == 0
    # A dependency on an already-closed quantum does not count.
    done = make_quantum("done")
    services.quantum_close(quantum_id=done.pk, reason="ok")
    services.dependency_add(quantum_id=c.pk, depends_on_id=done.pk)
    assert count() == 0


def test_closing_a_blocker_releases_every_dependent_in_one_statement():
    blocker = make_quantum("blocker")
    dependents = [make_quantum(f"d{i}", depends_on=[blocker.pk]) for i in range(5)]
    Quantum.objects.filter(pk=blocker.pk).update(status=QuantumStatus.CLOSED)
    assert set(ids(selectors.quanta_ready())) == {d.pk for d in dependents}
