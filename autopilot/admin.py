"""The autopilot's ledger in the admin: viewable, filterable, searchable — never edited by hand.

Every status change has side effects (a planner run, quanta filed, a wave, agents paused) that
only the services perform, and each table has one writer (autopilot.services): decide with
`manage.py goals ...` / `manage.py autopilot ...` or the Goals page and the autopilot card.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from autopilot.models import (
    BaseCheck,
    Finding,
    Goal,
    GoalTransition,
    Hold,
    Hub,
    HubTransition,
    Spend,
)
from core.admin import ReadOnly


class LedgerAdmin(ReadOnly, admin.ModelAdmin[Any]):
    pass


class GoalTransitionInline(ReadOnly, admin.TabularInline[Any, Any]):
    model = GoalTransition
    fields = readonly_fields = ("created_at", "from_status", "to_status", "by", "reason")
    ordering = ["created_at", "id"]
    extra = 0


@admin.register(Goal)
class GoalAdmin(LedgerAdmin):
    list_display = ["id", "title", "status", "priority", "source", "budget_usd", "created_at"]
    list_filter = ["status", "source", "priority"]
    search_fields = ["title", "description", "success_criteria", "reason"]
    list_select_related = ["epic"]
    date_hierarchy = "created_at"
    inlines = [GoalTransitionInline]


@admin.register(GoalTransition)
class GoalTransitionAdmin(LedgerAdmin):
    list_display = ["id", "goal", "from_status", "to_status", "by", "created_at"]
    list_filter = ["to_status"]
    search_fields = ["reason", "by", "=goal__id"]
    list_select_related = ["goal"]


@admin.register(Hub)
class HubAdmin(LedgerAdmin):
    list_display = ["id", "state", "paused", "forced", "since", "tick_at", "reason"]


@admin.register(HubTransition)
class HubTransitionAdmin(LedgerAdmin):
    list_display = ["id", "created_at", "from_state", "to_state", "by", "reason"]
    list_filter = ["to_state", "by"]
    search_fields = ["reason"]
    date_hierarchy = "created_at"


@admin.register(Spend)
class SpendAdmin(LedgerAdmin):
    list_display = ["id", "day", "scope", "goal", "usd", "tokens_in", "tokens_out", "calls"]
    list_filter = ["scope", "day"]
    search_fields = ["=goal__id"]
    list_select_related = ["goal"]
    date_hierarchy = "day"


@admin.register(Hold)
class HoldAdmin(LedgerAdmin):
    list_display = ["id", "agent_run", "scope", "reason", "created_at"]
    list_filter = ["scope"]
    list_select_related = ["agent_run"]


@admin.register(Finding)
class FindingAdmin(LedgerAdmin):
    list_display = ["id", "scanner", "path", "line", "rule", "quantum", "filed_at", "last_seen"]
    list_filter = ["scanner"]
    search_fields = ["path", "rule", "message", "skipped"]
    list_select_related = ["quantum"]


@admin.register(BaseCheck)
class BaseCheckAdmin(LedgerAdmin):
    list_display = ["id", "sha", "ok", "quantum", "created_at", "summary"]
    list_filter = ["ok"]
    search_fields = ["sha", "summary"]
    list_select_related = ["quantum"]
