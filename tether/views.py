"""The Tether page (questions and drifts) and the Grounding page (code changes and pipeline
mutations). Views stay thin: reads come from tether.selectors, every action is one service call
whose domain errors become a message (stale: nothing changed) or a form error (bad input)."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from django import forms
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from core.access import operator_required
from core.events import EventMessage
from core.live import (
    ActionRefused,
    LivePageError,
    action_id,
    action_text,
    live_attrs,
    live_page,
    ws_action,
)
from psychonauts.views import diff_files
from quanta.errors import QuantaError
from tether.errors import InvalidInput, NotFound, TetherError
from tether.forms import (
    AnswerForm,
    ChangeRejectForm,
    DriftGroundForm,
    DriftNoteForm,
    DriftRejectForm,
    MutationRejectForm,
)
from tether.models import (
    PRIORITY_RANK,
    ChangeReview,
    ChangeStatus,
    Drift,
    DriftStatus,
    PipelineMutation,
    Reaching,
    ReachingStatus,
)
from tether.selectors import (
    MutationView,
    change_detail,
    changes_list,
    drifts_list,
    mutations_list,
    reaching_get,
    reachings_pending,
    tether_counts,
)
from tether.services import (
    AnswerResult,
    change_approve,
    change_reject,
    drift_ground,
    drift_note,
    drift_reject,
    mutation_approve,
    mutation_reject,
    reaching_answer,
)

TETHER_TOPICS = ["tether:reaching", "tether:drifts"]
GROUNDING_TOPICS = ["tether:drifts", "tether:questions"]
RECENT_DRIFTS = 50

T = TypeVar("T")


# --- presentation helpers -------------------------------------------------------------------------

# CSS `order` of a reaching card: live fragments are appended at the end of the list, and the
# flex order puts them where the queue has them (priority, then deadline) without moving nodes
# (which would lose an answer being typed). Seconds since 2025 fit below one priority band.
_ORDER_EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
_ORDER_BAND = 500_000_000


def queue_order(reaching: Reaching) -> int:
    seconds = int((reaching.deadline - _ORDER_EPOCH).total_seconds())
    return PRIORITY_RANK.get(reaching.priority, 3) * _ORDER_BAND + min(
        max(seconds, 0), _ORDER_BAND - 1
    )


def _form(cls: type[forms.Form], prefix: str, pk: int, data: Any = None) -> forms.Form:
    """A form whose field ids are unique on a page listing many items."""
    return cls(data, auto_id=f"id_{prefix}{pk}_%s")


Bound = tuple[str, int, forms.Form]  # (form name, item id, the bound form with its errors)


def _pick(bound: Bound | None, name: str, pk: int, cls: type[forms.Form]) -> forms.Form:
    if bound is not None and bound[0] == name and bound[1] == pk:
        return bound[2]
    return _form(cls, name, pk)


def reaching_row(reaching: Reaching, bound: Bound | None = None) -> dict[str, Any]:
    return {
        "r": reaching,
        "order": queue_order(reaching),
        "form": _pick(bound, "answer", reaching.pk, AnswerForm),
    }


def drift_row(drift: Drift, bound: Bound | None = None) -> dict[str, Any]:
    reaching = drift.reaching if drift.reaching_id is not None else None
    # A timed-out question may still get one late answer: it grounds or supersedes this drift.
    late_ok = (
        drift.status == DriftStatus.OPEN
        and reaching is not None
        and reaching.status == ReachingStatus.TIMED_OUT
        and reaching.late_answered_at is None
    )
    return {
        "d": drift,
        "ground": _pick(bound, "ground", drift.pk, DriftGroundForm),
        "reject": _pick(bound, "reject", drift.pk, DriftRejectForm),
        "note": _pick(bound, "note", drift.pk, DriftNoteForm),
        "late": _pick(bound, "answer", reaching.pk, AnswerForm) if late_ok and reaching else None,
    }


def _drift_get(drift_id: int) -> Drift:
    drift = (
        Drift.objects.select_related("reaching", "quantum", "agent_run", "correction")
        .filter(pk=drift_id)
        .first()
    )
    if drift is None:
        raise NotFound(f"no drift #{drift_id}")
    return drift


def _or_404(fn: Callable[..., T], **kwargs: Any) -> T:
    try:
        return fn(**kwargs)
    except NotFound as exc:
        raise Http404(str(exc)) from None


# --- the Tether page ------------------------------------------------------------------------------


def _tether_render(
    request: HttpRequest, *, bound: Bound | None = None, status: int = 200
) -> HttpResponse:
    return render(
        request,
        "tether/page.html",
        {
            "reachings": [reaching_row(r, bound) for r in reachings_pending()],
            "drifts": [drift_row(d, bound) for d in drifts_list(limit=RECENT_DRIFTS)],
            "tether_counts": tether_counts(),
            **live_attrs(TETHER_TOPICS, "tether"),
        },
        status=status,
    )


def tether_page(request: HttpRequest) -> HttpResponse:
    return _tether_render(request)


def answer_message(result: AnswerResult) -> tuple[int, str]:
    """What the operator is told after an answer (a late one is not what they may expect)."""
    n = result.reaching_id
    if result.kind == "answered":
        tail = "the agent resumes with it" if result.resumed else "no agent was waiting any more"
        return messages.SUCCESS, f"Answered reaching #{n}; {tail}."
    if result.kind == "late_grounded":
        return messages.INFO, (
            f"Reaching #{n} had already timed out and the agent went on with its assumption. "
            f"Your late answer agrees with it: drift #{result.drift_id} is grounded."
        )
    if result.kind == "late_superseded":
        return messages.WARNING, (
            f"Reaching #{n} had already timed out and the agent went on with its assumption. "
            f"Your late answer supersedes drift #{result.drift_id}; correction quantum "
            f"#{result.correction_id} was filed."
        )
    return messages.SUCCESS, f"Answered reaching #{n}; kept on the quantum as instructions."


@require_POST
@operator_required
def reaching_answer_view(request: HttpRequest, reaching_id: int) -> HttpResponse:
    _or_404(reaching_get, reaching_id=reaching_id)
    form = _form(AnswerForm, "answer", reaching_id, request.POST)
    if form.is_valid():
        try:
            result = _or_404(
                reaching_answer,
                reaching_id=reaching_id,
                text=form.cleaned_data["text"],
                by=request.user.get_username(),
            )
        except InvalidInput as exc:
            form.add_error("text", str(exc))
        except TetherError as exc:  # stale: answered, cancelled, or already answered late
            messages.error(request, str(exc))
            return redirect("tether")
        else:
            messages.add_message(request, *answer_message(result))
            return redirect("tether")
    return _tether_render(request, bound=("answer", reaching_id, form), status=400)


def _drift_action(
    request: HttpRequest,
    drift_id: int,
    name: str,
    form_cls: type[forms.Form],
    act: Callable[[dict[str, Any], str], Drift],
    done: Callable[[Drift], str],
) -> HttpResponse:
    _or_404(_drift_get, drift_id=drift_id)
    form = _form(form_cls, name, drift_id, request.POST)
    if form.is_valid():
        try:
            drift = _or_404(act, data=form.cleaned_data, by=request.user.get_username())
        except InvalidInput as exc:
            form.add_error(next(iter(form.fields)), str(exc))
        except TetherError as exc:  # stale: decided already
            messages.error(request, str(exc))
            return redirect("tether")
        else:
            messages.success(request, done(drift))
            return redirect("tether")
    return _tether_render(request, bound=(name, drift_id, form), status=400)


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
        lambda d: f"Drift #{d.pk} noted.",
    )


@live_page("tether")
def tether_live(event: EventMessage, params: Mapping[str, str]) -> dict[str, Any]:
    payload = event["payload"]
    context: dict[str, Any] = {"tether_counts": tether_counts()}
    if event["type"] == "question_asked":
        try:
            reaching = reaching_get(reaching_id=int(payload["reaching_id"]))
        except (KeyError, NotFound):
            raise LivePageError("no such reaching") from None
        if reaching.status != ReachingStatus.PENDING:
            raise LivePageError("answered meanwhile")  # a replayed question: not on the list
        context["row"] = reaching_row(reaching)
    elif "drift_id" in payload:
        try:
            context["drow"] = drift_row(_drift_get(int(payload["drift_id"])))
        except NotFound:
            raise LivePageError("no such drift") from None
    return context


# --- the Grounding page ---------------------------------------------------------------------------


def mutation_row(view: MutationView, bound: Bound | None = None) -> dict[str, Any]:
    m = view.mutation
    label = f"current v{view.current_version}" if view.current_version else "(new pipeline)"
    lines = difflib.unified_diff(
        view.current_yaml.splitlines(), m.proposed_yaml.splitlines(), label, "proposed", lineterm=""
    )
    return {
        "v": view,
        "m": m,
        "diff": [
            {"tag": {"+": "add", "-": "del", "@": "hunk"}.get(line[:1], "ctx"), "text": line}
            for line in lines
            if not line.startswith(("---", "+++"))
        ],
        "reject": _pick(bound, "mreject", m.pk, MutationRejectForm),
    }


def change_row(change: ChangeReview) -> dict[str, Any]:
    return {"c": change}


def _grounding_render(
    request: HttpRequest, *, bound: Bound | None = None, status: int = 200
) -> HttpResponse:
    return render(
        request,
        "grounding/page.html",
        {
            "changes": [change_row(c) for c in changes_list(limit=100)],
            "mutations": [mutation_row(v, bound) for v in mutations_list(limit=50)],
            "tether_counts": tether_counts(),
            **live_attrs(GROUNDING_TOPICS, "grounding"),
        },
        status=status,
    )


def grounding_page(request: HttpRequest) -> HttpResponse:
    return _grounding_render(request)


def _change_render(
    request: HttpRequest,
    change_id: int,
    *,
    reject: forms.Form | None = None,
    status: int = 200,
) -> HttpResponse:
    detail = _or_404(change_detail, change_id=change_id)
    files = []
    for f in detail.files:
        parsed = diff_files(f.diff)
        files.append({"f": f, "lines": parsed[0]["lines"] if parsed else []})
    return render(
        request,
        "grounding/change.html",
        {
            "c": detail.review,
            "files": files,
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
    return messages.WARNING, (
        f"Change #{review.pk} conflicts with {review.base} ({review.comment}); nothing was "
        f"merged. Correction quantum #{review.correction_id} was filed."
    )


@require_POST
@operator_required
def change_approve_view(request: HttpRequest, change_id: int) -> HttpResponse:
    try:
        review = _or_404(change_approve, change_id=change_id, by=request.user.get_username())
    except TetherError as exc:  # decided already, branch moved or vanished, git refused
        messages.error(request, str(exc))
    else:
        messages.add_message(request, *change_message(review))
    return redirect("change", change_id=change_id)


@require_POST
@operator_required
def change_reject_view(request: HttpRequest, change_id: int) -> HttpResponse:
    form = ChangeRejectForm(request.POST)
    if form.is_valid():
        try:
            review = _or_404(
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


def _mutation_exists(mutation_id: int) -> None:
    if not PipelineMutation.objects.filter(pk=mutation_id).exists():
        raise Http404(f"no pipeline mutation #{mutation_id}")


@require_POST
@operator_required
def mutation_approve_view(request: HttpRequest, mutation_id: int) -> HttpResponse:
    _mutation_exists(mutation_id)
    try:
        m = _or_404(mutation_approve, mutation_id=mutation_id, by=request.user.get_username())
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
    form = _form(MutationRejectForm, "mreject", mutation_id, request.POST)
    if not form.is_valid():
        return _grounding_render(request, bound=("mreject", mutation_id, form), status=400)
    try:
        m = _or_404(
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
        change = (
            ChangeReview.objects.select_related("quantum")
            .defer("diff")
            .filter(pk=payload["change_id"])
            .first()
        )
        if change is None:
            raise LivePageError("no such change")
        context["crow"] = change_row(change)
    return context


# --- websocket actions (the consumer has checked user_can_operate) --------------------------------


def _refusing(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except (TetherError, QuantaError) as exc:
        raise ActionRefused(str(exc)) from None


@ws_action("reaching_answer")
def reaching_answer_ws(user: Any, message: Mapping[str, Any]) -> dict[str, Any]:
    reaching_id, text = action_id(message, "reaching_id"), action_text(message, "text")
    result = _refusing(
        lambda: reaching_answer(reaching_id=reaching_id, text=text, by=user.get_username())
    )
    return {
        "reaching_id": reaching_id,
        "kind": result.kind,
        "drift_id": result.drift_id,
        "correction_id": result.correction_id,
        "message": answer_message(result)[1],
    }


def _drift_reply(drift: Drift) -> dict[str, Any]:
    return {"drift_id": drift.pk, "status": drift.status, "correction_id": drift.correction_id}


@ws_action("drift_ground")
def drift_ground_ws(user: Any, message: Mapping[str, Any]) -> dict[str, Any]:
    drift_id, comment = action_id(message, "drift_id"), action_text(message, "comment")
    return _drift_reply(
        _refusing(lambda: drift_ground(drift_id=drift_id, comment=comment, by=user.get_username()))
    )


@ws_action("drift_reject")
def drift_reject_ws(user: Any, message: Mapping[str, Any]) -> dict[str, Any]:
    drift_id, reason = action_id(message, "drift_id"), action_text(message, "reason")
    return _drift_reply(
        _refusing(lambda: drift_reject(drift_id=drift_id, reason=reason, by=user.get_username()))
    )


@ws_action("drift_note")
def drift_note_ws(user: Any, message: Mapping[str, Any]) -> dict[str, Any]:
    drift_id, text = action_id(message, "drift_id"), action_text(message, "text")
    return _drift_reply(
        _refusing(lambda: drift_note(drift_id=drift_id, text=text, by=user.get_username()))
    )


@ws_action("change_approve")
def change_approve_ws(user: Any, message: Mapping[str, Any]) -> dict[str, Any]:
    change_id = action_id(message, "change_id")
    review = _refusing(lambda: change_approve(change_id=change_id, by=user.get_username()))
    return {"change_id": review.pk, "status": review.status, "message": change_message(review)[1]}


@ws_action("change_reject")
def change_reject_ws(user: Any, message: Mapping[str, Any]) -> dict[str, Any]:
    change_id, reason = action_id(message, "change_id"), action_text(message, "reason")
    review = _refusing(
        lambda: change_reject(change_id=change_id, reason=reason, by=user.get_username())
    )
    return {"change_id": review.pk, "status": review.status}


@ws_action("mutation_approve")
def mutation_approve_ws(user: Any, message: Mapping[str, Any]) -> dict[str, Any]:
    mutation_id = action_id(message, "mutation_id")
    m = _refusing(lambda: mutation_approve(mutation_id=mutation_id, by=user.get_username()))
    return {"mutation_id": m.pk, "status": m.status, "version": m.resulting_version}


@ws_action("mutation_reject")
def mutation_reject_ws(user: Any, message: Mapping[str, Any]) -> dict[str, Any]:
    mutation_id, reason = action_id(message, "mutation_id"), action_text(message, "reason")
    m = _refusing(
        lambda: mutation_reject(mutation_id=mutation_id, reason=reason, by=user.get_username())
    )
    return {"mutation_id": m.pk, "status": m.status}
