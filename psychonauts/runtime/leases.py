"""File leases in Redis for the shared-tree mode: exclusive or shared_read, with a TTL.

Keys (per workspace and path): `lease:x:<ws>:<path>` holds the exclusive holder (a string with
PX expiry); `lease:s:<ws>:<path>` is a sorted set of shared readers scored by expiry time.
Acquire is one Lua script, so check-and-set cannot interleave with another agent's acquire.
Expired exclusive leases vanish by themselves; expired readers are dropped by every acquire and
by `leases_sweep()`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from django.conf import settings

from core.redis import get_redis
from psychonauts.errors import LeaseConflict

LeaseMode = Literal["exclusive", "shared_read"]

# KEYS: exclusive key, shared key. ARGV: holder, mode, ttl_ms.
# Returns "" on success, or the conflicting holder.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local owner = redis.call('GET', KEYS[1])
if owner and owner ~= ARGV[1] then return owner end
if ARGV[2] == 'exclusive' then
  local readers = redis.call('ZRANGE', KEYS[2], 0, -1)
  for _, r in ipairs(readers) do
    if r ~= ARGV[1] then return r end
  end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
else
  redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return ''
"""

# Renew only what the holder still holds. Returns 1 if renewed, 0 if the lease was lost.
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ttl)
  return 1
end
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if score and tonumber(score) > now then
  redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
  if redis.call('PTTL', KEYS[2]) < ttl then redis.call('PEXPIRE', KEYS[2], ttl) end
  return 1
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"""


@dataclass(frozen=True)
class Lease:
    workspace: str
    path: str
    holder: str
    mode: LeaseMode


def _keys(workspace: str, path: str) -> tuple[str, str]:
    ws = hashlib.sha1(workspace.encode()).hexdigest()[:12]
    return f"lease:x:{ws}:{path}", f"lease:s:{ws}:{path}"


def lease_acquire(
    *, workspace: str, path: str, holder: str, mode: LeaseMode, ttl_s: float | None = None
) -> Lease:
    ttl_ms = int((ttl_s or settings.PSYCHONAUTS_LEASE_TTL_S) * 1000)
    conflict = get_redis().eval(_ACQUIRE, 2, *_keys(workspace, path), holder, mode, ttl_ms)
    if conflict:
        raise LeaseConflict(f"{path}: leased by {conflict}")
    return Lease(workspace, path, holder, mode)


def lease_renew(*, workspace: str, path: str, holder: str, ttl_s: float | None = None) -> bool:
    ttl_ms = int((ttl_s or settings.PSYCHONAUTS_LEASE_TTL_S) * 1000)
    return bool(get_redis().eval(_RENEW, 2, *_keys(workspace, path), holder, ttl_ms))


def lease_release(*, workspace: str, path: str, holder: str) -> None:
    get_redis().eval(_RELEASE, 2, *_keys(workspace, path), holder)


def lease_holds_exclusive(*, workspace: str, path: str, holder: str) -> bool:
    return get_redis().get(_keys(workspace, path)[0]) == holder


def lease_require_exclusive(*, workspace: str, path: str, holder: str) -> None:
    if not lease_holds_exclusive(workspace=workspace, path=path, holder=holder):
        raise LeaseConflict(
            f"{path}: write refused, you hold no exclusive lease on it (call lease_acquire)"
        )


def leases_sweep() -> int:
    """Drop expired shared readers everywhere; returns how many were dropped."""
    client = get_redis()
    now_s, now_us = client.time()
    now_ms = now_s * 1000 + now_us // 1000
    dropped = 0
    for key in client.scan_iter(match="lease:s:*", count=500):
        dropped += int(client.zremrangebyscore(key, "-inf", now_ms))
    return dropped


def leases_release_all(*, holder: str) -> None:
    """Release whatever `holder` still holds (an agent run ending)."""
    client = get_redis()
    for key in client.scan_iter(match="lease:x:*", count=500):
        if client.get(key) == holder:
            client.delete(key)
    for key in client.scan_iter(match="lease:s:*", count=500):
        client.zrem(key, holder)
