"""The ledger's admin pages load, filter and refuse edits that would break invariants."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from tether.models import Drift, Reaching


def test_it_shows_the_ledger_read_only(admin_client, make_quantum) -> None:
    quantum = make_quantum()
    reaching = Reaching.objects.create(
        quantum=quantum,
        question="Why?",
        assumption="because",
        deadline=timezone.now() + timedelta(1),
    )
    drift = Drift.objects.create(quantum=quantum, assumption="because", reaching=reaching)
    for name in ("reaching", "drift", "changereview", "pipelinemutation"):
        assert admin_client.get(f"/admin/tether/{name}/").status_code == 200
        assert admin_client.get(f"/admin/tether/{name}/add/").status_code == 403
    assert admin_client.get("/admin/tether/reaching/?status__exact=pending").status_code == 200
    page = admin_client.get(f"/admin/tether/drift/{drift.pk}/change/")
    assert page.status_code == 200
    admin_client.post(
        f"/admin/tether/drift/{drift.pk}/change/", {"comment": "seen", "status": "grounded"}
    )
    drift.refresh_from_db()
    assert (drift.status, drift.comment) == ("open", "seen")
