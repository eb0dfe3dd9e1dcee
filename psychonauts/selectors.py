"""Reads for the agent runtime."""

from __future__ import annotations

from decimal import Decimal

from django.db.models import QuerySet, Sum

from psychonauts.models import AgentTurn, Role, ToolCall, Usage
from psychonauts.registry import RegistryEntry, registry_list


def roles_list() -> QuerySet[Role]:
    return Role.objects.order_by("name")


def role_names() -> list[str]:
    return [str(name) for name in roles_list().values_list("name", flat=True)]


def agent_turns(*, agent_run_id: int) -> QuerySet[AgentTurn]:
    return AgentTurn.objects.filter(agent_run_id=agent_run_id).order_by("index")


def agent_tool_calls(*, agent_run_id: int) -> QuerySet[ToolCall]:
    return ToolCall.objects.filter(agent_run_id=agent_run_id).order_by("turn_index", "id")


def agents_running() -> list[RegistryEntry]:
    """The live registry (rebuilt from Postgres if Redis lost it)."""
    return registry_list()


def spend_usd(*, quantum_run_id: int | None = None, wave_id: int | None = None) -> Decimal:
    qs = Usage.objects.all()
    if quantum_run_id is not None:
        qs = qs.filter(quantum_run_id=quantum_run_id)
    if wave_id is not None:
        qs = qs.filter(wave_id=wave_id)
    return qs.aggregate(s=Sum("cost_usd"))["s"] or Decimal(0)
