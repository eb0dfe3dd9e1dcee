from __future__ import annotations

from collections.abc import Sequence

from core.events import EventMessage, event_message
from core.models import Event

CATCH_UP_LIMIT = 1000


def events_after(
    *, topics: Sequence[str], after: int, limit: int = CATCH_UP_LIMIT
) -> list[EventMessage]:
    """Events on `topics` with a sequence greater than `after`, oldest first."""
    rows = Event.objects.filter(topic__in=list(topics), id__gt=after).order_by("id")[:limit]
    return [event_message(e) for e in rows]
