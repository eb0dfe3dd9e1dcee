"""core.sql.rows_insert writes what bulk_create writes."""

from __future__ import annotations

from decimal import Decimal

import pytest

from bursts.models import AgentRun
from core.models import Event
from core.sql import FEW, rows_insert
from quanta.models import Quantum

pytestmark = pytest.mark.django_db

SKIP = {"id", "created_at", "updated_at", "agent_id", "quantum_id"}


def _quantum(title: str) -> Quantum:
    return Quantum(title=title, labels=["a", "b"], verify_commands=["make test"], priority=3)


def test_rows_insert_stores_what_bulk_create_stores() -> None:
    ours, theirs = _quantum("ours"), _quantum("theirs")
    rows_insert(Quantum, [ours])
    Quantum.objects.bulk_create([theirs])
    assert ours.pk is not None and not ours._state.adding
    got = Quantum.objects.filter(pk=ours.pk).values().get()
    want = Quantum.objects.filter(pk=theirs.pk).values().get()
    assert got["created_at"] is not None
    assert {k: v for k, v in got.items() if k not in SKIP | {"title"}} == {
        k: v for k, v in want.items() if k not in SKIP | {"title"}
    }
    agents = [
        AgentRun(agent_id=f"x_{n}", quantum=ours, role="coder", cost_usd=Decimal("0.5"))
        for n in range(3)
    ]
    rows_insert(AgentRun, agents)
    stored = list(AgentRun.objects.order_by("pk").values_list("pk", "agent_id", "cost_usd"))
    assert stored == [(a.pk, a.agent_id, Decimal("0.5")) for a in agents]


@pytest.mark.parametrize("count", [0, 1, FEW, FEW + 1])
def test_rows_insert_skips_generated_columns_whatever_the_count(count: int) -> None:
    events = [Event(topic="t", type="x", payload={"n": n}) for n in range(count)]
    rows_insert(Event, events)
    assert Event.objects.filter(topic="t").count() == len(events)
    assert len({e.pk for e in events}) == len(events)
    stored = dict(Event.objects.filter(topic="t").values_list("pk", "payload"))
    assert stored == {e.pk: {"n": n} for n, e in enumerate(events)}
    assert Event.objects.filter(topic="t", search__isnull=False).count() == len(events)
