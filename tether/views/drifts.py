"""Deciding a drift from the Tether page: ground it, reject it (a correction quantum is filed)
or note it. A bad form re-renders the Tether page with its errors under that drift."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from core.access import operator_required
from core.http import or_404
from tether.errors import InvalidInput, TetherError
from tether.forms import DriftGroundForm, DriftNoteForm, DriftRejectForm
from tether.models import Drift
from tether.selectors import drift_get
from tether.services import drift_ground, drift_note, drift_reject
from tether.views.common import item_form
from tether.views.reachings import tether_render


def _drift_action(
    request: HttpRequest,
    drift_id: int,
    name: str,
    form_cls: type[forms.Form],
    act: Callable[[dict[str, Any], str], Drift],
    done: Callable[[Drift], str],
) -> HttpResponse:
    or_404(drift_get, drift_id=drift_id)
    form = item_form(form_cls, name, drift_id, request.POST)
    if form.is_valid():
        try:
            drift = or_404(act, data=form.cleaned_data, by=request.user.get_username())
        except InvalidInput as exc:
            form.add_error(next(iter(form.fields)), str(exc))
        except TetherError as exc:  # stale: decided already
            messages.error(request, str(exc))
            return redirect("tether")
        else:
            messages.success(request, done(drift))
            return redirect("tether")
    return tether_render(request, bound=(name, drift_id, form), status=400)


@require_POST
@operator_required
def drift_ground_view(request: HttpRequest, drift_id: int) -> HttpResponse:
    return _drift_action(
        request,
        drift_id,
        "ground",
        DriftGroundForm,
        lambda data, by: drift_ground(drift_id=drift_id, comment=data["comment"], by=by),
        lambda d: f"Drift #{d.pk} grounded: the assumption stands.",
    )


@require_POST
@operator_required
def drift_reject_view(request: HttpRequest, drift_id: int) -> HttpResponse:
    return _drift_action(
        request,
        drift_id,
        "reject",
        DriftRejectForm,
        lambda data, by: drift_reject(drift_id=drift_id, reason=data["reason"], by=by),
        lambda d: f"Drift #{d.pk} rejected; correction quantum #{d.correction_id} filed.",
    )


@require_POST
@operator_required
def drift_note_view(request: HttpRequest, drift_id: int) -> HttpResponse:
    return _drift_action(
        request,
        drift_id,
        "note",
        DriftNoteForm,
        lambda data, by: drift_note(drift_id=drift_id, text=data["text"], by=by),
        lambda d: f"Note added to drift #{d.pk}; it stays {d.status}.",
    )
