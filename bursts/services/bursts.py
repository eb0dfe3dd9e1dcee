"""The one writer of Burst rows: a burst opens (collecting), runs, drains and closes.

Every write here happens with the burst's wave locked (`SELECT ... FOR UPDATE` on the wave, see
`bursts.services.waves`): one manager acts on a wave's bursts at a time, so the phase changes
are plain saves.
"""

from __future__ import annotations

from django.db.models import Count
from django.utils import timezone

from bursts.events import BurstCompleted, BurstEventType, burst_event
from bursts.hooks import ON_BURST_CLOSED
from bursts.models import Burst, BurstPhase, Wave


def burst_open(*, wave: Wave, number: int) -> Burst:
    """A new burst of the wave, collecting."""
    return Burst.objects.create(wave=wave, number=number, phase=BurstPhase.COLLECTING)


def burst_phase_set(*, burst: Burst, phase: BurstPhase) -> None:
    """Move the burst to `phase` (collecting -> running -> draining)."""
    burst.phase = phase
    burst.save(update_fields=["phase"])


def burst_close(*, burst: Burst) -> None:
    """Done, with the count of its runs by status; announced as `burst_completed`."""
    counts = dict(burst.runs.values("status").annotate(n=Count("id")).values_list("status", "n"))
    burst.phase = BurstPhase.DONE
    burst.finished_at = timezone.now()
    burst.stats = {"runs": sum(counts.values()), **counts}
    burst.save(update_fields=["phase", "finished_at", "stats"])
    burst_event(
        BurstEventType.BURST_COMPLETED,
        BurstCompleted(
            wave_id=burst.wave_id, burst_id=burst.pk, number=burst.number, stats=burst.stats
        ),
    )
    for hook in ON_BURST_CLOSED:
        hook(burst)


__all__ = ["burst_close", "burst_open", "burst_phase_set"]
