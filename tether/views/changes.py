"""A change's page: its diff file by file, what the commits left out, the checks on the merged
result; approving (into the merge queue) or rejecting (the quantum reopens)."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from core.access import operator_required
from core.http import or_404
from quanta.errors import QuantaError
from tether.errors import InvalidInput, TetherError
from tether.forms import ChangeRejectForm
from tether.models import ChangeReview, ChangeStatus
from tether.selectors import change_detail
from tether.services import (
    change_approve,
    change_reject,
    changes_approve,
    changes_approve_low_risk,
)


def _change_render(
    request: HttpRequest,
    change_id: int,
    *,
    reject: forms.Form | None = None,
    status: int = 200,
) -> HttpResponse:
    detail = or_404(change_detail, change_id=change_id)
    return render(
        request,
        "grounding/change.html",
        {
            "c": detail.review,
            "files": [{"f": f, "lines": f.lines} for f in detail.files],
            "reject": reject or ChangeRejectForm(),
            "pending": detail.review.status == ChangeStatus.PENDING,
        },
        status=status,
    )


def change_page(request: HttpRequest, change_id: int) -> HttpResponse:
    return _change_render(request, change_id)


def change_message(review: ChangeReview) -> tuple[int, str]:
    if review.status == ChangeStatus.MERGED:
        return messages.SUCCESS, (
            f"Change #{review.pk} merged into {review.base} ({review.merge_sha[:10]})."
        )
    if review.status in (ChangeStatus.QUEUED, ChangeStatus.MERGING):
        return messages.SUCCESS, (
            f"Change #{review.pk} is in the merge queue: merged into {review.base} and verified "
            "in turn; the base moves only if the checks pass."
        )
    if review.status == ChangeStatus.FAILED:
        return messages.WARNING, f"Change #{review.pk} was not merged: {review.comment}"
    return messages.WARNING, (
        f"Change #{review.pk} conflicts with {review.base} ({review.comment}); nothing was "
        f"merged. Correction quantum #{review.correction_id} was filed."
    )


@require_POST
@operator_required
def change_approve_view(request: HttpRequest, change_id: int) -> HttpResponse:
    try:
        review = or_404(change_approve, change_id=change_id, by=request.user.get_username())
    except TetherError as exc:  # decided already, branch moved or vanished, git refused
        messages.error(request, str(exc))
    else:
        messages.add_message(request, *change_message(review))
    return redirect("change", change_id=change_id)


def approvals_message(
    outcomes: list[tuple[int, ChangeReview | TetherError]],
) -> list[tuple[int, str]]:
    """What the operator is told after approving several changes: the queued ones in one line,
    each refusal on its own (the same outcomes `manage.py tether approve` prints)."""
    if not outcomes:
        return [(messages.INFO, "No pending low-risk change to approve.")]
    queued = [f"#{i}" for i, o in outcomes if not isinstance(o, TetherError)]
    said: list[tuple[int, str]] = []
    if queued:
        said.append(
            (
                messages.SUCCESS,
                f"{len(queued)} change(s) in the merge queue: {', '.join(queued)}. Each is merged "
                "and verified in turn; the base moves only if its checks pass.",
            )
        )
    said += [
        (messages.ERROR, f"Change #{i} refused: {o}")
        for i, o in outcomes
        if isinstance(o, TetherError)
    ]
    return said


@require_POST
@operator_required
def changes_approve_view(request: HttpRequest) -> HttpResponse:
    """Approve the selected changes, or every pending low-risk one: the rules of `manage.py
    tether approve ID... | --all-low-risk`."""
    by = request.user.get_username()
    if request.POST.get("all_low_risk"):
        outcomes = changes_approve_low_risk(by=by)
    else:
        raw = request.POST.getlist("change")
        ids = [int(v) for v in raw if v.isdigit() and 0 < int(v) < 2**63]
        if not ids or len(ids) != len(raw):
            messages.error(request, "Select the changes to approve, or approve all low-risk ones.")
            return redirect(reverse("grounding") + "#changes-table")
        outcomes = changes_approve(change_ids=list(dict.fromkeys(ids)), by=by)
    for level, text in approvals_message(outcomes):
        messages.add_message(request, level, text)
    return redirect(reverse("grounding") + "#changes-table")


@require_POST
@operator_required
def change_reject_view(request: HttpRequest, change_id: int) -> HttpResponse:
    form = ChangeRejectForm(request.POST)
    if form.is_valid():
        try:
            review = or_404(
                change_reject,
                change_id=change_id,
                reason=form.cleaned_data["reason"],
                by=request.user.get_username(),
            )
        except InvalidInput as exc:
            form.add_error("reason", str(exc))
        except (TetherError, QuantaError) as exc:
            # Stale (decided already), or its quantum cannot be reopened (open again meanwhile):
            # the whole rejection rolled back.
            messages.error(request, str(exc))
            return redirect("change", change_id=change_id)
        else:
            messages.success(
                request, f"Change #{review.pk} rejected; quantum #{review.quantum_id} reopened."
            )
            return redirect("change", change_id=change_id)
    return _change_render(request, change_id, reject=form, status=400)
