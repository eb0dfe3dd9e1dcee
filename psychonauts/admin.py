"""Roles, traumas and mail are editable; turns, tool calls and usage are the run's record
(resume replays them, budgets sum them), so they are viewable only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Model, QuerySet
from django.http import HttpRequest

from psychonauts.containment.traumas import trauma_apply_everywhere
from psychonauts.models import (
    AgentTurn,
    CommandTrauma,
    DiaryEntry,
    Endpoint,
    Mail,
    Role,
    SandboxIdentity,
    ToolCall,
    Usage,
)
from psychonauts.routing.endpoints import endpoints_health_check


class RecordAdmin(admin.ModelAdmin[Any]):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


@admin.register(Role)
class RoleAdmin(admin.ModelAdmin[Role]):
    list_display = ["name", "provider", "model", "max_turns", "timeout_s", "updated_at"]
    list_filter = ["provider"]
    search_fields = ["name", "description", "system_prompt"]
    readonly_fields = ["source", "updated_at"]


@admin.register(AgentTurn)
class AgentTurnAdmin(RecordAdmin):
    list_display = ["agent_run", "index", "stop_reason", "complete", "tokens_in", "tokens_out"]
    list_filter = ["complete", "stop_reason"]
    search_fields = ["agent_run__agent_id"]
    list_select_related = ["agent_run"]
    raw_id_fields = ["agent_run"]


@admin.register(ToolCall)
class ToolCallAdmin(RecordAdmin):
    list_display = ["agent_run", "turn_index", "name", "is_error", "completed", "duration_ms"]
    list_filter = ["name", "is_error", "completed"]
    search_fields = ["agent_run__agent_id", "tool_use_id", "output"]
    list_select_related = ["agent_run"]
    raw_id_fields = ["agent_run"]


@admin.register(Usage)
class UsageAdmin(RecordAdmin):
    list_display = [
        "agent_run",
        "provider",
        "model",
        "tokens_in",
        "tokens_out",
        "cost_usd",
        "created_at",
    ]
    list_filter = ["provider", "model"]
    search_fields = ["agent_run__agent_id", "model"]
    list_select_related = ["agent_run"]
    raw_id_fields = ["agent_run", "quantum_run", "wave"]


@admin.register(Mail)
class MailAdmin(admin.ModelAdmin[Mail]):
    list_display = ["sender", "recipient", "subject", "quantum", "read_at", "created_at"]
    list_filter = ["read_at"]
    search_fields = ["sender", "recipient", "subject", "body"]
    raw_id_fields = ["quantum"]
    list_select_related = ["quantum"]


@admin.register(DiaryEntry)
class DiaryEntryAdmin(admin.ModelAdmin[DiaryEntry]):
    list_display = ["agent_run", "kind", "created_at"]
    list_filter = ["kind"]
    search_fields = ["text", "agent_run__agent_id"]
    raw_id_fields = ["agent_run"]
    list_select_related = ["agent_run"]


@admin.register(CommandTrauma)
class CommandTraumaAdmin(admin.ModelAdmin[CommandTrauma]):
    """A trauma an agent's command recorded applies to its quantum until the operator applies
    it to every quantum (the action below)."""

    list_display = [
        "pattern", "active", "source", "quantum_id", "hits", "reason", "confirmed_by",
        "last_seen_at", "created_at",
    ]  # fmt: skip
    list_filter = ["active", "source"]
    search_fields = ["pattern", "reason", "agent_id"]
    readonly_fields = ["confirmed_by", "confirmed_at"]
    actions = ["apply_everywhere"]

    @admin.action(description="Apply the selected traumas to every quantum")
    def apply_everywhere(self, request: HttpRequest, queryset: QuerySet[CommandTrauma]) -> None:
        for trauma_id in queryset.values_list("pk", flat=True):
            trauma_apply_everywhere(trauma_id=trauma_id, operator=request.user.get_username())
        self.message_user(request, "they apply to every quantum now")


@admin.register(Endpoint)
class EndpointAdmin(admin.ModelAdmin[Endpoint]):
    """The registry of model endpoints; the health columns are the beat's to write."""

    list_display = [
        "name", "provider", "model", "tier", "base_url", "max_concurrency", "enabled", "health",
        "health_reason", "checked_at",
    ]  # fmt: skip
    list_filter = ["tier", "provider", "enabled", "health"]
    search_fields = ["name", "model", "base_url"]
    readonly_fields = ["health", "health_reason", "checked_at", "created_at", "updated_at"]
    actions = ["check_now"]

    @admin.action(description="Check the selected endpoints now")
    def check_now(self, request: HttpRequest, queryset: QuerySet[Endpoint]) -> None:
        results = endpoints_health_check(names=list(queryset.values_list("name", flat=True)))
        for result in results:
            verdict = "up" if result.up else f"down: {result.reason}"
            self.message_user(request, f"{result.name}: {verdict}")


@admin.register(SandboxIdentity)
class SandboxIdentityAdmin(RecordAdmin):
    """Viewable only: a row deleted while its holder runs would hand its uid to another."""

    list_display = ["holder", "slot", "renewed_at", "released_at"]
    search_fields = ["holder"]

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False
