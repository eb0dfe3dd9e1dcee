"""The Tether page: the questions agents wait on, in queue order, and the recent drifts below
them; answering a question. Reads come from tether.selectors, each action is one service call
whose domain errors become a message (stale: nothing changed) or a form error (bad input)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from core.access import operator_required
from core.events import EventMessage
from core.http import or_404
from core.live import LivePageError, live_attrs, live_page
from tether.errors import InvalidInput, NotFound, TetherError
from tether.forms import AnswerForm, DriftGroundForm, DriftNoteForm, DriftRejectForm
from tether.models import PRIORITY_RANK, Drift, DriftStatus, Reaching, ReachingStatus
from tether.selectors import drift_get, drifts_list, reaching_get, reachings_pending, tether_counts
from tether.services import AnswerResult, reaching_answer
from tether.views.common import Bound, form_pick, item_form

TETHER_TOPICS = ["tether:reaching", "tether:drifts"]
RECENT_DRIFTS = 50

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


def reaching_row(reaching: Reaching, bound: Bound | None = None) -> dict[str, Any]:
    return {
        "r": reaching,
        "order": queue_order(reaching),
        "form": form_pick(bound, "answer", reaching.pk, AnswerForm),
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
    late = form_pick(bound, "answer", reaching.pk, AnswerForm) if late_ok and reaching else None
    return {
        "d": drift,
        "ground": form_pick(bound, "ground", drift.pk, DriftGroundForm),
        "reject": form_pick(bound, "reject", drift.pk, DriftRejectForm),
        "note": form_pick(bound, "note", drift.pk, DriftNoteForm),
        "late": late,
    }


def tether_render(
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
    return tether_render(request)


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
    or_404(reaching_get, reaching_id=reaching_id)
    form = item_form(AnswerForm, "answer", reaching_id, request.POST)
    if form.is_valid():
        try:
            result = or_404(
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
    return tether_render(request, bound=("answer", reaching_id, form), status=400)


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
            context["drow"] = drift_row(drift_get(drift_id=int(payload["drift_id"])))
        except NotFound:
            raise LivePageError("no such drift") from None
    return context
