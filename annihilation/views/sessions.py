"""The session search page: the events' full-text search, by session, linking to each agent's
Focus page."""

from __future__ import annotations

from django import forms
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse

from core.errors import BadSearchQuery
from core.search import QUERY_MAX, SessionHit, sessions_search

PAGE_HITS = 50


class SessionSearchForm(forms.Form):
    q = forms.CharField(required=False, label="search", max_length=QUERY_MAX)
    topic = forms.CharField(required=False, max_length=200)
    quantum = forms.IntegerField(required=False, min_value=1, max_value=2**63 - 1)
    role = forms.CharField(required=False, max_length=100)


def _link(hit: SessionHit) -> str | None:
    if hit.agent_run_id is None:
        return None
    return reverse("focus", kwargs={"agent_run_id": hit.agent_run_id})


def sessions_page(request: HttpRequest) -> HttpResponse:
    form = SessionSearchForm(request.GET or None)
    rows: list[dict[str, object]] = []
    searched = False
    if form.is_valid() and form.cleaned_data["q"].strip():
        data = form.cleaned_data
        try:
            hits = sessions_search(
                data["q"],
                topic=data["topic"].strip() or None,
                quantum_id=data["quantum"],
                role=data["role"].strip() or None,
                limit=PAGE_HITS,
            )
        except BadSearchQuery as exc:
            form.add_error("q", str(exc))
        else:
            searched = True
            rows = [{"hit": h, "link": _link(h)} for h in hits]
    return render(
        request,
        "annihilation/sessions.html",
        {"form": form, "rows": rows, "searched": searched},
    )
