"""Sandbox identities: a slot (uid) per live holder, kept, released and taken over."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from bursts.models import Burst, QuantumRun, RunStatus, Wave
from bursts.services.drain import runs_drain
from psychonauts.containment import identities
from psychonauts.containment.identities import (
    BASE_CHECK,
    SCANNER,
    SHARED_TREE,
    IdentitiesExhausted,
    identities_release,
    identity_slot,
)
from psychonauts.models import SandboxIdentity
from quanta.services import quantum_create

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_holders() -> None:
    """Every slot starts free: rows a worker of an earlier test wrote after its database was
    flushed would otherwise be taken over as stale holders."""
    SandboxIdentity.objects.all().delete()


def test_it_gives_quanta_whose_ids_collide_different_slots() -> None:
    first, second = identity_slot(quantum_id=7), identity_slot(quantum_id=100_007)

    assert first == 7 and second != first
    assert identity_slot(quantum_id=100_007) == second  # kept


def test_the_runtime_s_own_identities_are_nobody_else_s() -> None:
    quanta = {identity_slot(quantum_id=q) for q in (1, 99_999, 99_998, 99_997)}
    own = {identity_slot(quantum_id=q) for q in (SHARED_TREE, SCANNER, BASE_CHECK)}

    assert len(own) == 3 and not own & quanta


def test_a_released_quantum_gets_its_slot_back() -> None:
    slot = identity_slot(quantum_id=42)

    assert identities_release(quantum_ids=[42]) == 1
    row = SandboxIdentity.objects.get(holder="q42")
    assert row.released_at is not None
    assert identity_slot(quantum_id=42) == slot
    row.refresh_from_db()
    assert row.released_at is None


def test_a_slot_goes_to_another_holder_only_once_released_long_enough(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(identities, "SLOTS", 3)
    held = [identity_slot(quantum_id=q) for q in (1, 2, 3)]
    with pytest.raises(IdentitiesExhausted):
        identity_slot(quantum_id=4)

    identities_release(quantum_ids=[2])
    with pytest.raises(IdentitiesExhausted):
        identity_slot(quantum_id=4)  # released a moment ago: a command may still be ending
    SandboxIdentity.objects.filter(holder="q2").update(
        released_at=timezone.now() - dt.timedelta(hours=1)
    )

    assert identity_slot(quantum_id=4) == held[1]
    assert not SandboxIdentity.objects.filter(holder="q2").exists()
    assert identity_slot(quantum_id=1) == held[0]


def test_a_live_slot_unrenewed_past_the_stale_limit_may_be_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(identities, "SLOTS", 2)
    identity_slot(quantum_id=1)
    identity_slot(quantum_id=2)
    SandboxIdentity.objects.filter(holder="q1").update(
        renewed_at=timezone.now() - dt.timedelta(days=2)
    )

    assert identity_slot(quantum_id=3) == 1


def test_draining_a_run_releases_its_quantum_s_identity() -> None:
    quantum = quantum_create(title="Fix the flaky cache")
    wave = Wave.objects.create()
    burst = Burst.objects.create(wave=wave, number=1)
    QuantumRun.objects.create(
        wave=wave, burst=burst, quantum=quantum, pipeline_name="default", status=RunStatus.DONE
    )
    identity_slot(quantum_id=quantum.pk)

    runs_drain(wave=wave, runs=list(QuantumRun.objects.select_related("burst")))

    assert SandboxIdentity.objects.get(holder=f"q{quantum.pk}").released_at is not None
