"""When a prompt is cached for an hour rather than five minutes.

A cache entry written for an hour costs 2x the input price instead of 1.25x; it pays when the
agent's next call comes more than five minutes later (an agent waiting on the Tether, or held
by a budget), when the whole prompt is read back at 0.1x instead of written again at 1.25x. The
odds are measured, not assumed: the share of a role's recent calls (the last day's, at most
SAMPLE of them) after which the same agent run's next call came 5 to 60 minutes later, kept per
process for REFRESH_S. The hour is taken when

    share x (1.25 - 0.1) x the whole prompt >= (2 - 1.25) x what this call writes

(what it writes: about its last two messages, the turn since the previous call).
"""

from __future__ import annotations

import threading
import time

from django.db import connection

from bursts.models import AgentRun
from psychonauts.models import Usage
from psychonauts.runtime.budget import (
    CACHE_READ_FACTOR,
    CACHE_WRITE_FACTOR,
    CACHE_WRITE_LONG_FACTOR,
)

SAMPLE = 2000
REFRESH_S = 300.0
SHORT_S, LONG_S = 300, 3600

_SQL = f"""
SELECT COUNT(*) FILTER (WHERE gap > {SHORT_S} AND gap <= {LONG_S}), COUNT(*)
FROM (
    SELECT EXTRACT(EPOCH FROM LEAD(u.created_at) OVER (
               PARTITION BY u.agent_run_id ORDER BY u.id) - u.created_at) AS gap
    FROM {Usage._meta.db_table} u
    JOIN {AgentRun._meta.db_table} r ON r.id = u.agent_run_id
    WHERE r.role = %s AND u.created_at > now() - interval '1 day'
    ORDER BY u.id DESC
    LIMIT {SAMPLE}
) calls
WHERE gap IS NOT NULL
"""

_shares: dict[str, tuple[float, float]] = {}  # role -> (when read, share)
_lock = threading.Lock()


def long_wait_share(role: str) -> float:
    """The share of the role's recent calls followed by a wait of 5 to 60 minutes."""
    now = time.monotonic()
    with _lock:
        known = _shares.get(role)
    if known is not None and now - known[0] < REFRESH_S:
        return known[1]
    with connection.cursor() as cursor:
        cursor.execute(_SQL, [role])
        row = cursor.fetchone()
    long, total = (int(row[0]), int(row[1])) if row else (0, 0)
    share = long / total if total else 0.0
    with _lock:
        _shares[role] = (now, share)
    return share


def long_cache_pays(*, role: str, whole_chars: int, new_chars: int) -> bool:
    """Whether this call's prompt should be cached for an hour (see the module's docstring)."""
    share = long_wait_share(role)
    if not share:
        return False
    saved = share * (CACHE_WRITE_FACTOR - CACHE_READ_FACTOR) * whole_chars
    return saved >= (CACHE_WRITE_LONG_FACTOR - CACHE_WRITE_FACTOR) * new_chars


def long_wait_forget() -> None:
    """Read the shares again on next use (tests)."""
    with _lock:
        _shares.clear()
