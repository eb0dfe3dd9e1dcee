"""Reads for the agent runtime."""

from __future__ import annotations

from decimal import Decimal

from django.db.models import QuerySet, Sum

from psychonauts.models import AgentTurn, Role, ToolCall, Usage, Verification
from psychonauts.registry import RegistryEntry, registry_list


def roles_list() -> QuerySet[Role]:
    return Role.objects.order_by("name")


def role_names() -> list[str]:
    return [str(name) for name in roles_list().values_list("name", flat=True)]


def role_tools(name: str) -> list[str]:
    """A role's allowed tools ([] for an unknown role)."""
    tools = Role.objects.filter(name=name).values_list("allowed_tools", flat=True).first()
    return [str(t) for t in tools] if isinstance(tools, list) else []


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


def agent_verifications(*, agent_run_id: int) -> QuerySet[Verification]:
    """A run's verification rounds, in order (Focus)."""
    return (
        Verification.objects.filter(agent_run_id=agent_run_id)
        .select_related("agent_run")
        .order_by("round")
    )


def quantum_verifications(*, quantum_id: int, limit: int = 30) -> list[Verification]:
    """A quantum's latest verifications, newest first (the quantum page)."""
    return list(
        Verification.objects.filter(quantum_id=quantum_id)
        .select_related("agent_run")
        .order_by("-created_at", "-id")[:limit]
    )
