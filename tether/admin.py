"""The Tether's ledger in the admin: viewable, filterable, searchable — never edited by hand.

Every status change has side effects (resuming an agent, a correction quantum, a git merge, a
pipeline version) that only the services perform: decide with `manage.py tether ...` (or the
operator UI). Only the operator's comment fields stay editable where nothing depends on them.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest

from tether.models import ChangeReview, Drift, PipelineMutation, Reaching


class LedgerAdmin(admin.ModelAdmin[Any]):
    editable: tuple[str, ...] = ()

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> list[str]:
        return [f.name for f in self.model._meta.fields if f.name not in self.editable]


@admin.register(Reaching)
class ReachingAdmin(LedgerAdmin):
    list_display = ["id", "status", "priority", "quantum", "agent_run", "question", "deadline"]
    list_filter = ["status", "priority"]
    search_fields = ["question", "assumption", "answer", "=quantum__id"]
    list_select_related = ["quantum", "agent_run"]
    date_hierarchy = "created_at"


@admin.register(Drift)
class DriftAdmin(LedgerAdmin):
    list_display = ["id", "status", "kind", "quantum", "assumption", "decided_by", "created_at"]
    list_filter = ["status", "kind"]
    search_fields = ["assumption", "rationale", "comment", "=quantum__id"]
    list_select_related = ["quantum"]
    editable = ("comment",)


@admin.register(ChangeReview)
class ChangeReviewAdmin(LedgerAdmin):
    list_display = ["id", "status", "risk", "quantum", "branch", "additions", "deletions"]
    list_filter = ["status", "risk"]
    search_fields = ["branch", "head_sha", "=quantum__id"]
    list_select_related = ["quantum"]
    editable = ("comment",)


@admin.register(PipelineMutation)
class PipelineMutationAdmin(LedgerAdmin):
    list_display = [
        "id",
        "status",
        "pipeline_name",
        "base_version",
        "resulting_version",
        "deadline",
    ]
    list_filter = ["status", "pipeline_name"]
    search_fields = ["pipeline_name", "rationale", "proposed_yaml"]
    list_select_related = ["agent_run"]
    editable = ("comment",)
