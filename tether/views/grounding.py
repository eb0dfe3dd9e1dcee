"""The Grounding page: the merge queue (live), the change reviews (pending first) and the
pipeline proposals, each beside the pipeline as it is now; approving or rejecting a proposal."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from core.access import operator_required
from core.events import EventMessage
from core.http import or_404
from core.live import LivePageError, live_attrs, live_page
from tether.errors import NotFound, TetherError
from tether.forms import MutationRejectForm
from tether.models import ChangeReview
from tether.selectors import (
    MutationView,
    change_get,
    changes_list,
    merge_queue_list,
    mutation_diff,
    mutation_exists,
    mutations_list,
    tether_counts,
)
from tether.services import mutation_approve, mutation_reject
from tether.views.common import Bound, form_pick, item_form
from tether.views.sections import grounding_sections

GROUNDING_TOPICS = ["tether:drifts", "tether:questions"]


def mutation_row(view: MutationView, bound: Bound | None = None) -> dict[str, Any]:
    m = view.mutation
    return {
        "v": view,
        "m": m,
        "diff": mutation_diff(view),
        "reject": form_pick(bound, "mreject", m.pk, MutationRejectForm),
    }


def change_row(change: ChangeReview) -> dict[str, Any]:
    return {"c": change}


def grounding_render(
    request: HttpRequest, *, bound: Bound | None = None, status: int = 200
) -> HttpResponse:
    return render(
        request,
        "grounding/page.html",
        {
            "changes": [change_row(c) for c in changes_list(limit=100)],
            "queue": merge_queue_list(limit=50),
            "mutations": [mutation_row(v, bound) for v in mutations_list(limit=50)],
            "tether_counts": tether_counts(),
            "sections": grounding_sections(request),
            **live_attrs(GROUNDING_TOPICS, "grounding"),
        },
        status=status,
    )


def grounding_page(request: HttpRequest) -> HttpResponse:
    return grounding_render(request)


def _mutation_exists(mutation_id: int) -> None:
    if not mutation_exists(mutation_id=mutation_id):
        raise Http404(f"no pipeline mutation #{mutation_id}")


@require_POST
@operator_required
def mutation_approve_view(request: HttpRequest, mutation_id: int) -> HttpResponse:
    _mutation_exists(mutation_id)
    try:
        m = or_404(mutation_approve, mutation_id=mutation_id, by=request.user.get_username())
    except TetherError as exc:  # decided already, or the pipeline changed since the proposal
        messages.error(request, str(exc))
    else:
        messages.success(
            request, f"Pipeline {m.pipeline_name} is now at version {m.resulting_version}."
        )
    return redirect(reverse("grounding") + f"#mutation-{mutation_id}")


@require_POST
@operator_required
def mutation_reject_view(request: HttpRequest, mutation_id: int) -> HttpResponse:
    _mutation_exists(mutation_id)
    form = item_form(MutationRejectForm, "mreject", mutation_id, request.POST)
    if not form.is_valid():
        return grounding_render(request, bound=("mreject", mutation_id, form), status=400)
    try:
        m = or_404(
            mutation_reject,
            mutation_id=mutation_id,
            reason=form.cleaned_data["reason"],
            by=request.user.get_username(),
        )
    except TetherError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Proposal #{m.pk} for {m.pipeline_name} rejected.")
    return redirect(reverse("grounding") + f"#mutation-{mutation_id}")


@live_page("grounding")
def grounding_live(event: EventMessage, params: Mapping[str, str]) -> dict[str, Any]:
    payload = event["payload"]
    context: dict[str, Any] = {"tether_counts": tether_counts()}
    if "change_id" in payload:
        context["queue"] = merge_queue_list(limit=50)
        try:
            context["crow"] = change_row(change_get(change_id=int(payload["change_id"])))
        except NotFound:
            raise LivePageError("no such change") from None
    return context
