"""Runs are state machines driven by the burst manager: viewable here, never edited by hand
(cancel a wave with `manage.py waves cancel ID`)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest

from bursts.models import AgentRun, Burst, QuantumRun, Wave


class ReadOnlyAdmin(admin.ModelAdmin[Any]):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


@admin.register(Wave)
class WaveAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "status",
        "labels",
        "continuous",
        "burst_count",
        "started_by",
        "started_at",
        "finished_at",
    ]
    list_filter = ["status", "continuous"]
    search_fields = ["started_by", "error"]


@admin.register(Burst)
class BurstAdmin(ReadOnlyAdmin):
    list_display = ["id", "wave", "number", "phase", "started_at", "finished_at"]
    list_filter = ["phase"]
    search_fields = ["=wave__id"]
    list_select_related = ["wave"]


@admin.register(QuantumRun)
class QuantumRunAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "quantum",
        "wave",
        "burst",
        "pipeline_name",
        "pipeline_version",
        "status",
        "current_stage",
        "started_at",
        "finished_at",
    ]
    list_filter = ["status", "pipeline_name"]
    search_fields = ["quantum__title", "error_reason"]
    list_select_related = ["quantum", "wave", "burst"]


@admin.register(AgentRun)
class AgentRunAdmin(ReadOnlyAdmin):
    list_display = [
        "agent_id",
        "attempt",
        "role",
        "status",
        "phase",
        "provider",
        "model",
        "tokens_in",
        "tokens_out",
        "cost_usd",
        "started_at",
        "finished_at",
    ]
    list_filter = ["status", "phase", "role", "provider"]
    search_fields = ["agent_id", "quantum__title", "result", "error"]
    list_select_related = ["quantum"]
