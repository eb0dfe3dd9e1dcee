from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib import messages
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from bursts.selectors import agent_run_find
from core.access import operator_required
from core.events import EventMessage
from core.live import LivePageError, events_settled_id, live_attrs, live_page
from psychonauts.events import AgentEventType
from psychonauts.focus import (
    agent_diary,
    agent_stream,
    agent_tool_calls,
    agent_turns,
    focus_fetch_due,
    worktree_diff,
)
from psychonauts.runtime.runs import agent_run_create
from psychonauts.runtime.tools import VERDICT_TOOL
from psychonauts.runtime.verification import verdict_find
from psychonauts.sections import focus_sections
from psychonauts.selectors import (
    agent_spend,
    agent_verifications,
    role_names,
    role_tools,
    roles_spend,
)
from psychonauts.tasks import execute_agent_run, focus_fetch
from psychonauts.workspaces.diffs import diff_parse
from quanta.errors import QuantumNotFound
from quanta.forms import AgentRunForm
from quanta.selectors import quantum_get


@require_POST
@operator_required
def agent_run_start(request: HttpRequest, quantum_id: int) -> HttpResponse:
    """`manage.py psychonaut run --role R --quantum ID`, but on a worker: then watch it on Focus."""
    try:
        quantum_get(quantum_id=quantum_id)
    except QuantumNotFound:
        raise Http404(f"no quantum #{quantum_id}") from None
    form = AgentRunForm(request.POST, roles=role_names())
    if not form.is_valid():
        for field, errors in form.errors.items():
            messages.error(request, f"{field}: {' '.join(str(e) for e in errors)}")
        return redirect("quantum", quantum_id=quantum_id)
    with transaction.atomic():
        run = agent_run_create(
            quantum_id=quantum_id,
            role=form.cleaned_data["role"],
            context=form.cleaned_data["context"],
        )
        # Sent once the row is committed, so the worker always finds the run it is given.
        run_id = run.pk
        transaction.on_commit(lambda: execute_agent_run.delay(run_id))
    messages.success(request, f"Agent {run.agent_id} (attempt {run.attempt}) queued.")
    return redirect("focus", agent_run_id=run.pk)


def roles_page(request: HttpRequest) -> HttpResponse:
    """The roles, each with what its agents have spent."""
    return render(request, "psychonauts/roles.html", {"rows": roles_spend()})


def focus(request: HttpRequest, agent_run_id: int) -> HttpResponse:
    # The catch-up point first, then the reads: an event written while the page is read (a fast
    # agent's first turn) is replayed when the socket subscribes, not lost between the two.
    after = events_settled_id()
    run = agent_run_find(agent_run_id=agent_run_id)
    if run is None:
        raise Http404(f"no agent run {agent_run_id}")
    _fetch_if_due(run.quantum_id)
    return render(
        request,
        "psychonauts/focus.html",
        {
            "run": run,
            "spend": agent_spend(agent_run_id=run.pk),
            "turns": agent_turns(agent_run_id=run.pk),
            "stream": agent_stream(run=run),
            "tool_calls": agent_tool_calls(agent_run_id=run.pk),
            "diary": agent_diary(agent_run_id=run.pk),
            **_checks_context(run.pk, run.role),
            "diff_files": diff_parse(worktree_diff(quantum_id=run.quantum_id)),
            "sections": focus_sections(run),
            **live_attrs([f"agent:{run.agent_id}"], "focus", after=after, agent_run_id=run.pk),
        },
    )


def _fetch_if_due(quantum_id: int) -> None:
    """In remote mode the diff is the branch as this host last fetched it; a worker fetches it
    (never the request), and the page's next draw shows it."""
    if focus_fetch_due(quantum_id=quantum_id):
        focus_fetch.delay(quantum_id)


def _checks_context(agent_run_id: int, role: str) -> dict[str, Any]:
    """What decided the run's end besides its answer: verification rounds and its verdict."""
    return {
        "verifications": agent_verifications(agent_run_id=agent_run_id),
        "verdict": verdict_find(agent_run_id=agent_run_id),
        "expects_verdict": VERDICT_TOOL in role_tools(role),
    }


# Events after which the side panels are redrawn (the header is redrawn after every event).
_TOOL_EVENTS: frozenset[AgentEventType] = frozenset({"tool_call", "tool_result"})
_DIFF_EVENTS: frozenset[AgentEventType] = frozenset(
    {"committed", "restored", "set_aside", "done", "error", "cancelled"}
)


@live_page("focus")
def focus_live(event: EventMessage, params: Mapping[str, str]) -> dict[str, Any]:
    """Everything one event of the run can have changed: the header (status, phase, turn,
    tokens, cost) always; tool calls and diary after a tool's call or result; the diff after a
    commit or the run's end; verification and verdict after theirs."""
    # One agent id has several attempts; show only the attempt on screen.
    if str(event["payload"].get("agent_run_id")) != params.get("agent_run_id"):
        raise LivePageError("another attempt's event")
    run = agent_run_find(agent_run_id=int(params["agent_run_id"]))
    if run is None:
        raise LivePageError("no such agent run")
    kind = event["type"]
    context: dict[str, Any] = {
        "run": run,
        "turns": agent_turns(agent_run_id=run.pk),
        "spend": agent_spend(agent_run_id=run.pk),
    }
    if kind in _TOOL_EVENTS:
        context["tool_calls"] = agent_tool_calls(agent_run_id=run.pk)
        context["diary"] = agent_diary(agent_run_id=run.pk)
        context["panels"] = True
    if kind in _DIFF_EVENTS:
        _fetch_if_due(run.quantum_id)
        context["diff_files"] = diff_parse(worktree_diff(quantum_id=run.quantum_id))
        context["redraw_diff"] = True
    if kind in ("verification", "verdict"):  # their fragments redraw those sections
        context.update(_checks_context(run.pk, run.role))
    return context
