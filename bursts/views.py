from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from bursts.errors import BurstsError, WaveNotFound
from bursts.forms import WaveCancelForm
from bursts.models import Wave
from bursts.sections import wave_section_topics, wave_sections
from bursts.selectors import TimelineBar, wave_timeline, waves_list
from bursts.services import wave_cancel
from core.access import operator_required
from core.events import EventMessage
from core.live import (
    ActionRefused,
    LivePageError,
    action_id,
    live_attrs,
    live_page,
    ws_action,
)

# The timeline picture: one row per burst and run, time on x.
ROW_H, LABEL_W, PLOT_W = 22, 260, 640


def waves(request: HttpRequest) -> HttpResponse:
    return render(request, "bursts/waves.html", {"waves": waves_list(limit=100)})


@require_POST
@operator_required
def wave_cancel_view(request: HttpRequest, wave_id: int) -> HttpResponse:
    if not Wave.objects.filter(pk=wave_id).exists():
        raise Http404(f"no wave {wave_id}")
    form = WaveCancelForm({"wave_id": wave_id, "reason": request.POST.get("reason", "")})
    form.is_valid()
    try:
        wave_cancel(wave_id=wave_id, reason=form.cleaned_data.get("reason") or "cancelled")
    except BurstsError as exc:
        # Stale: the wave ended meanwhile. Say so; nothing changed.
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Wave {wave_id} cancelled.")
    # Back to the page the form was on; never to another site (`next` comes from the client).
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        target = "dashboard"
    return redirect(target)


@ws_action("wave_cancel")
def wave_cancel_ws(user: Any, message: Mapping[str, Any]) -> dict[str, Any]:
    wave_id = action_id(message, "wave_id")
    try:
        wave = wave_cancel(wave_id=wave_id, reason=f"cancelled by {user.get_username()}")
    except BurstsError as exc:
        raise ActionRefused(str(exc)) from None
    return {"wave_id": wave.pk, "status": wave.status}


def timeline_geometry(bars: list[TimelineBar], span: float) -> list[dict[str, Any]]:
    """Pixel rectangles of the timeline (presentation only: the times come from the selector)."""
    scale = PLOT_W / span
    return [
        {
            **bar,
            "y": i * ROW_H + 4,
            "x": LABEL_W + bar["start_s"] * scale,
            "w": max((bar["end_s"] - bar["start_s"]) * scale, 2.0),
        }
        for i, bar in enumerate(bars)
    ]


def _wave_page_context(wave_id: int) -> dict[str, Any]:
    try:
        wave, bars, span = wave_timeline(wave_id=wave_id)
    except WaveNotFound:
        raise Http404(f"no wave {wave_id}") from None
    ticks = [{"x": LABEL_W + PLOT_W * i / 4, "label": f"{span * i / 4:.1f}s"} for i in range(5)]
    return {
        "wave": wave,
        "rows": timeline_geometry(bars, span),
        "span": span,
        "ticks": ticks,
        "svg_w": LABEL_W + PLOT_W + 40,
        "svg_h": max(len(bars), 1) * ROW_H + 30,
        "label_w": LABEL_W,
    }


def wave_page(request: HttpRequest, wave_id: int) -> HttpResponse:
    context = _wave_page_context(wave_id)
    topics = ["burst:events", *wave_section_topics()]
    return render(
        request,
        "bursts/wave.html",
        {
            **context,
            "sections": wave_sections(wave_id),
            **live_attrs(topics, "wave", wave_id=wave_id),
        },
    )


@live_page("wave")
def wave_live(event: EventMessage, params: Mapping[str, str]) -> dict[str, Any]:
    """The timeline for the wave's own burst events; for the topics of the sections apps
    above registered (bursts.sections), the sections that event redraws."""
    try:
        wave_id = int(params["wave_id"])
    except (KeyError, ValueError):  # the page's parameters come from the client
        raise LivePageError("no wave id") from None
    if event["topic"] != "burst:events":
        sections = wave_sections(wave_id, event=event)
        if not sections:
            raise LivePageError("no section of this wave follows the event")
        return {"sections": sections}
    if event["payload"].get("wave_id") != wave_id:
        raise LivePageError("another wave's event")
    try:
        return _wave_page_context(wave_id)
    except Http404:
        raise LivePageError("no such wave") from None
