"""What a threads worker makes for its agents before its first task (registered with
`core.warmups.WARMUPS`, from psychonauts/hooks.py), so that the first hundred agents on a fresh worker do not
each wait for it."""

from __future__ import annotations

from psychonauts.containment.sandbox import sandbox_status
from psychonauts.routing.providers.anthropic import shared_clients_warm


def agents_warm_up(concurrency: int) -> None:
    """Probe the sandbox and make the model clients.

    The first `sandbox_status` starts a real sandbox while holding the lock every agent's start
    takes, so on a fresh worker every agent waited behind it; the clients (`shared_clients_warm`)
    load the TLS certificates and the HTTP stack's modules.
    """
    sandbox_status()
    shared_clients_warm()
