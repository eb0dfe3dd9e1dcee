"""The quantum page: the quantum with its dependencies, comments, runs, drifts and changes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from bursts.selectors import quantum_runs
from core.events import EventMessage
from core.live import LivePageError, live_attrs, live_page
from psychonauts.environments.selectors import quantum_environment
from psychonauts.selectors import quantum_spend, quantum_verifications, role_names
from quanta.errors import QuantumNotFound
from quanta.forms import (
    AgentRunForm,
    CloseForm,
    CommentForm,
    DependencyForm,
    DependencyRemoveForm,
)
from quanta.models import Quantum
from quanta.selectors import (
    Neighbourhood,
    quantum_comments,
    quantum_get,
    quantum_neighbourhood,
    quantum_why_not_ready,
)
from tether.selectors import quantum_changes, quantum_drifts

# The neighbourhood picture: waits-on column, the quantum, waited-on-by column.
NODE_W, NODE_H, GAP, COL = 210, 34, 12, 300


def _quantum_or_404(quantum_id: int) -> Quantum:
    try:
        return quantum_get(quantum_id=quantum_id)
    except QuantumNotFound:
        raise Http404(f"no quantum #{quantum_id}") from None


def neighbourhood_svg(hood: Neighbourhood) -> dict[str, Any]:
    """Boxes and arrows for the template (presentation only; the edges come from the selector)."""
    rows = max(len(hood.upstream), len(hood.downstream), 1)
    height = rows * (NODE_H + GAP) + GAP
    centre_y = height / 2 - NODE_H / 2

    def column(items: list[Any], x: float) -> list[dict[str, Any]]:
        top = (height - len(items) * (NODE_H + GAP) + GAP) / 2
        return [
            {"n": n, "kind": kind, "x": x, "y": top + i * (NODE_H + GAP)}
            for i, (n, kind) in enumerate(items)
        ]

    up = column(hood.upstream, 10)
    down = column(hood.downstream, 10 + 2 * COL)
    centre_x = 10 + COL
    centre = {"n": hood.quantum, "x": centre_x, "y": centre_y}
    edges = [
        # An arrow from the dependent to what it waits on, labelled with the edge kind.
        {"x1": centre_x, "y1": centre_y + NODE_H / 2, "x2": u["x"] + NODE_W,
         "y2": u["y"] + NODE_H / 2, "kind": u["kind"]}
        for u in up
    ] + [
        {"x1": d["x"], "y1": d["y"] + NODE_H / 2, "x2": centre_x + NODE_W,
         "y2": centre_y + NODE_H / 2, "kind": d["kind"]}
        for d in down
    ]  # fmt: skip
    return {
        "up": up,
        "down": down,
        "centre": centre,
        "edges": edges,
        "width": 20 + 2 * COL + NODE_W,
        "height": height,
        "node_w": NODE_W,
        "node_h": NODE_H,
    }


def _detail_context(quantum_id: int) -> dict[str, Any]:
    quantum = _quantum_or_404(quantum_id)
    return {
        "quantum": quantum,
        "why": quantum_why_not_ready(quantum_id=quantum_id),
        "graph": neighbourhood_svg(quantum_neighbourhood(quantum_id=quantum_id)),
        "comments": quantum_comments(quantum_id=quantum_id),
        "runs": quantum_runs(quantum_id=quantum_id),
        "verifications": quantum_verifications(quantum_id=quantum_id),
        "spend": quantum_spend(quantum_id=quantum_id),
        "environment": quantum_environment(
            quantum_id=quantum_id, repository_id=quantum.repository_id
        ),
    }


def quantum_detail(request: HttpRequest, quantum_id: int) -> HttpResponse:
    context = _detail_context(quantum_id)
    return render(
        request,
        "quanta/detail.html",
        {
            **context,
            "comment_form": CommentForm(),
            "close_form": CloseForm(),
            "dependency_form": DependencyForm(),
            "dependency_remove_form": DependencyRemoveForm(),
            "agent_run_form": AgentRunForm(roles=role_names()),
            "drifts": quantum_drifts(quantum_id=quantum_id),
            "changes": quantum_changes(quantum_id=quantum_id),
            **live_attrs(["quanta", "burst:events"], "quantum", quantum_id=quantum_id),
        },
    )


@live_page("quantum")
def quantum_live(event: EventMessage, params: Mapping[str, str]) -> dict[str, Any]:
    try:
        quantum_id = int(params["quantum_id"])
    except (KeyError, ValueError):
        raise LivePageError("no quantum id") from None
    if event["payload"].get("quantum_id") != quantum_id:
        raise LivePageError("another quantum's event")
    try:
        return _detail_context(quantum_id)
    except Http404:
        raise LivePageError("quantum gone") from None
