from __future__ import annotations

from django.contrib import admin

from psychonauts.models import AgentTurn, CommandTrauma, DiaryEntry, Mail, Role, ToolCall, Usage


@admin.register(Role)
class RoleAdmin(admin.ModelAdmin[Role]):
    list_display = ["name", "provider", "model", "max_turns", "timeout_s", "updated_at"]
    search_fields = ["name", "description"]


@admin.register(AgentTurn)
class AgentTurnAdmin(admin.ModelAdmin[AgentTurn]):
    list_display = ["agent_run", "index", "stop_reason", "complete", "tokens_in", "tokens_out"]
    list_select_related = ["agent_run"]
    raw_id_fields = ["agent_run"]


@admin.register(ToolCall)
class ToolCallAdmin(admin.ModelAdmin[ToolCall]):
    list_display = ["agent_run", "turn_index", "name", "is_error", "completed", "duration_ms"]
    list_select_related = ["agent_run"]
    raw_id_fields = ["agent_run"]


@admin.register(Usage)
class UsageAdmin(admin.ModelAdmin[Usage]):
    list_display = ["agent_run", "provider", "model", "tokens_in", "tokens_out", "cost_usd"]
    list_select_related = ["agent_run"]
    raw_id_fields = ["agent_run", "quantum_run", "wave"]


@admin.register(Mail)
class MailAdmin(admin.ModelAdmin[Mail]):
    list_display = ["sender", "recipient", "subject", "read_at", "created_at"]


@admin.register(DiaryEntry)
class DiaryEntryAdmin(admin.ModelAdmin[DiaryEntry]):
    list_display = ["agent_run", "kind", "created_at"]
    raw_id_fields = ["agent_run"]


@admin.register(CommandTrauma)
class CommandTraumaAdmin(admin.ModelAdmin[CommandTrauma]):
    list_display = ["pattern", "active", "created_at"]
