"""Reads for the agent runtime."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from decimal import Decimal
from typing import Any, TypedDict

from django.db.models import Count, Q, QuerySet, Sum

from bursts.models import RUN_TERMINAL, QuantumRun
from psychonauts.models import AgentTurn, Role, ToolCall, Usage, Verification
from psychonauts.routing.registry import RegistryEntry, registry_list


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


class AgentSpend(TypedDict):
    """What an agent run's model calls took and cost (Focus, `psychonaut agents`)."""

    calls: int
    tokens_in: int  # read from no cache, written to none
    tokens_out: int
    cache_read: int
    cache_write: int
    cost_usd: Decimal  # of the priced calls
    unpriced: int  # calls to a model whose price is unknown
    cache_share: float | None  # of the input tokens, those read from cache; None: no input yet
    cost: str  # cost_usd as shown: "$0.0123", "price unknown", "$0.0123 + 2 calls unpriced"


def _spend(row: Mapping[str, Any]) -> AgentSpend:
    def n(key: str) -> int:
        return int(row.get(key) or 0)

    read, write, plain = n("cache_read"), n("cache_write"), n("tokens_in")
    whole = read + write + plain
    cost = Decimal(row.get("cost_usd") or 0)
    calls, unpriced = n("calls"), n("unpriced")
    if calls and unpriced == calls:
        shown = "price unknown"
    else:
        shown = f"${cost:.4f}" + (f" + {unpriced} calls unpriced" if unpriced else "")
    return AgentSpend(
        calls=calls,
        tokens_in=plain,
        tokens_out=n("tokens_out"),
        cache_read=read,
        cache_write=write,
        cost_usd=cost,
        unpriced=unpriced,
        cache_share=read / whole if whole else None,
        cost=shown,
    )


_SPEND_SUMS = {
    "calls": Count("id"),
    "tokens_in": Sum("tokens_in"),
    "tokens_out": Sum("tokens_out"),
    "cache_read": Sum("cache_read_tokens"),
    "cache_write": Sum("cache_write_tokens") + Sum("cache_write_long_tokens"),
    "cost_usd": Sum("cost_usd"),
    "unpriced": Count("id", filter=Q(priced=False)),
}


def agents_spend(*, agent_run_ids: list[int]) -> dict[int, AgentSpend]:
    """Each run's spend, in one query (every id has an entry, zero when it made no call)."""
    rows = (
        Usage.objects.filter(agent_run_id__in=agent_run_ids)
        .values("agent_run_id")
        .annotate(**_SPEND_SUMS)
    )
    found = {int(r["agent_run_id"]): _spend(r) for r in rows}
    return {pk: found.get(pk) or _spend({}) for pk in agent_run_ids}


def agent_spend(*, agent_run_id: int) -> AgentSpend:
    return agents_spend(agent_run_ids=[agent_run_id])[agent_run_id]


class RoleSpend(TypedDict):
    role: str
    spend: AgentSpend


class WaveSpend(TypedDict):
    """A wave's spend (the wave page): in all and by role, and the cost its quantum runs would
    come to at the rate of those finished so far."""

    total: AgentSpend
    roles: list[RoleSpend]
    runs_finished: int
    runs: int
    projected: str  # "" until a run has finished


def wave_spend(*, wave_id: int) -> WaveSpend:
    """Two grouped statements: the usage by role, the quantum runs by whether they finished."""
    rows = list(
        Usage.objects.filter(wave_id=wave_id)
        .values("agent_run__role")
        .annotate(**_SPEND_SUMS)
        .order_by("agent_run__role")
    )
    roles = [RoleSpend(role=str(r["agent_run__role"]), spend=_spend(r)) for r in rows]
    whole: dict[str, Any] = {key: sum(r.get(key) or 0 for r in rows) for key in _SPEND_SUMS}
    total = _spend(whole)
    counts = QuantumRun.objects.filter(wave_id=wave_id).aggregate(
        runs=Count("id"), finished=Count("id", filter=Q(status__in=RUN_TERMINAL))
    )
    runs, finished = int(counts["runs"]), int(counts["finished"])
    projected = ""
    if finished:
        estimate = total["cost_usd"] / finished * runs
        projected = f"${estimate:.4f}" + (" (priced calls only)" if total["unpriced"] else "")
    return WaveSpend(
        total=total, roles=roles, runs_finished=finished, runs=runs, projected=projected
    )


def quanta_spend(*, quantum_ids: Collection[int]) -> AgentSpend:
    """Everything the agents of these quanta have spent, over all their runs, in one statement
    (a goal's page: its epic and its quanta)."""
    row = Usage.objects.filter(agent_run__quantum_id__in=list(quantum_ids)).aggregate(**_SPEND_SUMS)
    return _spend(row)


def quantum_spend(*, quantum_id: int) -> AgentSpend:
    """Everything the quantum's agents have spent, over all its runs."""
    return quanta_spend(quantum_ids=[quantum_id])


class RoleRow(TypedDict):
    """A role as the Roles page and `psychonaut roles` show it: its definition (None for a role
    whose calls are recorded but which is defined no more) and what its agents have spent."""

    name: str
    role: Role | None
    spend: AgentSpend


def roles_spend() -> list[RoleRow]:
    """Every role, defined or with recorded calls, with its agents' spend over all their runs:
    two statements (the roles, the usage grouped by role)."""
    rows = Usage.objects.values("agent_run__role").annotate(**_SPEND_SUMS)
    spent = {str(r["agent_run__role"]): _spend(r) for r in rows}
    defined = {r.name: r for r in roles_list()}
    return [
        RoleRow(name=name, role=defined.get(name), spend=spent.get(name) or _spend({}))
        for name in sorted(defined.keys() | spent.keys())
    ]


def wave_spend_context(wave_id: int) -> dict[str, Any]:
    return dict(wave_spend(wave_id=wave_id))


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
