"""Sandbox identities: which uid each holder's commands run as, one live holder per uid.

A root worker runs every sandboxed command as an unprivileged uid, SANDBOX_UID_BASE + a slot.
The slot is a row of `SandboxIdentity` (Postgres: several workers, several hosts), unique per
holder and per slot, so the kernel's per-uid limits (processes) and signals never cross from
one holder to another. A holder is a quantum, or one of the runtime's own identities: the
shared tree (every agent of the shared workspace mode), the scanners, the base check.

A quantum takes its slot at its first command (its preferred slot is its id modulo the number of
slots, else the first free one), keeps it while it runs, and releases it when its run is drained
(`identities_release`, from the burst manager's drain hook). A released row stays its holder's:
the quantum gets the same slot back when it runs again (a merge, a later run), so the files of
its worktree stay its own. Another holder takes a row over only when no slot is free, and only a
row released for RELEASED_GRACE, or left unrenewed for SANDBOX_UID_STALE_S: by then nothing can
still run under it (every command ends within its wall time).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from psychonauts.errors import PsychonautError
from psychonauts.models import SandboxIdentity

logger = logging.getLogger(__name__)

# Slots 0 .. SLOTS-1 are handed out; slot SLOTS is the sandbox probe's and SLOTS + 1 the
# environment builder's (no holder, no row).
SLOTS = 100_000
PROBE_SLOT = SLOTS
BUILDER_SLOT = SLOTS + 1
# Identities of the runtime's own, by the quantum id their callers pass (real quanta are >= 1).
SHARED_TREE = 0
SCANNER = -1
BASE_CHECK = -2
_NAMED = {SHARED_TREE: "shared-tree", SCANNER: "scanner", BASE_CHECK: "base-check"}
# A live row is renewed at most this often (one write per holder per interval, not per command).
RENEW_EVERY = dt.timedelta(minutes=5)
# A released row is taken over by another holder only after this long.
RELEASED_GRACE = dt.timedelta(minutes=10)
ATTEMPTS = 8

# -- name: free_slot --
# The first slot no row holds: at or after %(start)s, else from 0 (a slot one past a held one,
# or the start, or 0: the lowest free slot of each gap is among them).
FREE_SLOT_SQL = """
SELECT c.s FROM (
    SELECT %(start)s AS s
    UNION ALL SELECT slot + 1 FROM psychonauts_sandboxidentity WHERE slot + 1 < %(slots)s
    UNION ALL SELECT 0
) AS c
WHERE NOT EXISTS (SELECT 1 FROM psychonauts_sandboxidentity t WHERE t.slot = c.s)
ORDER BY (c.s < %(start)s), c.s
LIMIT 1
"""


class IdentitiesExhausted(PsychonautError):
    """Every sandbox slot is held by a live holder: no command can run under a uid of its own."""


def identity_holder(quantum_id: int) -> str:
    """The holder name of a quantum id (or of one of the runtime's own identities)."""
    if quantum_id > 0:
        return f"q{quantum_id}"
    try:
        return _NAMED[quantum_id]
    except KeyError:
        raise PsychonautError(f"no sandbox identity for quantum id {quantum_id}") from None


def identity_slot(*, quantum_id: int) -> int:
    """The holder's slot: its own row (revived or renewed when due), a new row on its preferred
    slot or the first free one, or a row taken over. IdentitiesExhausted when none is left."""
    holder = identity_holder(quantum_id)
    preferred = quantum_id % SLOTS if quantum_id > 0 else SLOTS - 1 + quantum_id
    for _ in range(ATTEMPTS):
        now = timezone.now()
        row = (
            SandboxIdentity.objects.filter(holder=holder)
            .values_list("slot", "renewed_at", "released_at")
            .first()
        )
        if row is not None:
            slot, renewed_at, released_at = row
            if released_at is None and now - renewed_at < RENEW_EVERY:
                return slot
            # Compare-and-set on (holder, slot): a takeover meanwhile moved the row away.
            if SandboxIdentity.objects.filter(holder=holder, slot=slot).update(
                renewed_at=now, released_at=None
            ):
                return slot
            continue
        free = _free_slot(preferred)
        if free is None:
            taken = _take_over(holder, now)
            if taken is None:
                raise IdentitiesExhausted(
                    f"all {SLOTS} sandbox uids are held by live holders; wait for runs to "
                    "end (a released uid is free again after "
                    f"{RELEASED_GRACE.seconds // 60} minutes)"
                )
            return taken
        try:
            with transaction.atomic():
                SandboxIdentity.objects.create(holder=holder, slot=free, renewed_at=now)
        except IntegrityError:
            continue  # the slot or the holder was taken meanwhile: look again
        return free
    raise PsychonautError(f"could not settle a sandbox uid for {holder} (contention)")


def _free_slot(preferred: int) -> int | None:
    if not SandboxIdentity.objects.filter(slot=preferred).exists():
        return preferred
    with connection.cursor() as cursor:
        cursor.execute(FREE_SLOT_SQL, {"start": preferred, "slots": SLOTS})
        found = cursor.fetchone()
    return None if found is None else int(found[0])


def _take_over(holder: str, now: dt.datetime) -> int | None:
    """The slot of the row released or unrenewed longest ago, moved to `holder` by
    compare-and-set (None when no row may be taken)."""
    stale = now - dt.timedelta(seconds=float(settings.SANDBOX_UID_STALE_S))
    for _ in range(ATTEMPTS):
        victim = (
            SandboxIdentity.objects.filter(
                Q(released_at__lt=now - RELEASED_GRACE) | Q(released_at=None, renewed_at__lt=stale)
            )
            .order_by("renewed_at")
            .first()
        )
        if victim is None:
            return None
        moved = SandboxIdentity.objects.filter(
            pk=victim.pk,
            holder=victim.holder,
            renewed_at=victim.renewed_at,
            released_at=victim.released_at,
        ).update(holder=holder, renewed_at=now, released_at=None)
        if moved:
            logger.info(
                "sandbox slot %s moved from %s to %s", victim.slot, victim.holder, holder,
                extra={"slot": victim.slot, "holder": holder, "previous": victim.holder},
            )  # fmt: skip
            return victim.slot
    return None


def identities_release(*, quantum_ids: Sequence[int]) -> int:
    """Release the quanta's rows (their runs ended); returns how many were live."""
    holders = [identity_holder(q) for q in quantum_ids if q > 0]
    if not holders:
        return 0
    return SandboxIdentity.objects.filter(holder__in=holders, released_at=None).update(
        released_at=timezone.now()
    )
