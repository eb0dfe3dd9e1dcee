"""What a threads worker makes for its agents before its first task (registered with
`core.warmups.WARMUPS`, from psychonauts/hooks.py), so that the first hundred agents on a fresh worker do not
each wait for it."""

from __future__ import annotations

import contextlib

from psychonauts.containment.sandbox import sandbox_status
from psychonauts.executors.base import OURS, ExecutorError
from psychonauts.executors.dispatch import runner_class
from psychonauts.models import Role
from psychonauts.routing.providers.anthropic import shared_clients_warm


def agents_warm_up(concurrency: int) -> None:
    """Probe the sandbox, make the model clients and load the roles' agent CLI executors.

    The first `sandbox_status` starts a real sandbox while holding the lock every agent's start
    takes, so on a fresh worker every agent waited behind it; the clients (`shared_clients_warm`)
    load the TLS certificates and the HTTP stack's modules; a CLI executor brings the MCP SDK
    (about 0.5 s to import), loaded here when a role runs one.
    """
    sandbox_status()
    shared_clients_warm()
    for role in Role.objects.exclude(executor__in=(OURS, "")).only("name", "executor"):
        with contextlib.suppress(ExecutorError):  # the role's run says why, not the worker
            runner_class(role)
