"""Reflection in the admin: rules, deltas, skills and runs are viewable, filterable and
searchable. Rules and skills may be edited (their text and tags; their record is the
services'); deltas are decided through reflection.services.playbook (applying one changes the
playbook); runs, rule and skill uses and confidence points are a ledger."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from core.admin import ReadOnly
from reflection.models import (
    PlaybookDelta,
    PlaybookRule,
    ReflectionRun,
    RuleConfidencePoint,
    RuleUse,
    Skill,
    SkillUse,
)


@admin.register(PlaybookRule)
class PlaybookRuleAdmin(admin.ModelAdmin[Any]):
    list_display = ["id", "text", "kind", "scope", "maturity", "confidence", "helpful", "harmful"]
    list_filter = ["maturity", "kind", "scope"]
    search_fields = ["text"]
    # The record moves only by feedback and decay (reflection.services.playbook).
    readonly_fields = [
        "confidence",
        "confidence_at",
        "helpful",
        "harmful",
        "maturity",
        "last_feedback_at",
        "evidence_event_ids",
        "evidence_agent_run_ids",
        "created_by",
        "created_at",
        "updated_at",
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # rules come from accepted deltas


@admin.register(PlaybookDelta)
class PlaybookDeltaAdmin(ReadOnly, admin.ModelAdmin[Any]):
    list_display = [
        "id",
        "op",
        "status",
        "scope",
        "kind",
        "text",
        "rule",
        "decided_by",
        "created_at",
    ]
    list_filter = ["status", "op", "scope", "kind"]
    search_fields = ["text", "reason"]
    list_select_related = ["rule"]


@admin.register(Skill)
class SkillAdmin(admin.ModelAdmin[Any]):
    list_display = ["id", "name", "alpha", "beta", "uses", "last_used_at"]
    search_fields = ["name", "template"]
    # The record moves only by outcomes (reflection.services.skills).
    readonly_fields = ["alpha", "beta", "uses", "last_used_at", "created_at"]


@admin.register(SkillUse)
class SkillUseAdmin(ReadOnly, admin.ModelAdmin[Any]):
    list_display = ["id", "skill", "agent_run", "outcome", "created_at"]
    list_filter = ["outcome"]
    search_fields = ["skill__name"]
    list_select_related = ["skill", "agent_run"]


@admin.register(ReflectionRun)
class ReflectionRunAdmin(ReadOnly, admin.ModelAdmin[Any]):
    list_display = ["id", "status", "burst", "wave", "created_at", "finished_at"]
    list_filter = ["status"]
    search_fields = ["error"]
    list_select_related = ["burst", "wave"]


@admin.register(RuleUse)
class RuleUseAdmin(ReadOnly, admin.ModelAdmin[Any]):
    list_display = ["id", "rule", "agent_run", "rank", "outcome"]
    list_filter = ["outcome"]
    search_fields = ["rule__text"]
    list_select_related = ["rule", "agent_run"]


@admin.register(RuleConfidencePoint)
class RuleConfidencePointAdmin(ReadOnly, admin.ModelAdmin[Any]):
    list_display = ["id", "rule", "confidence", "cause", "at"]
    list_filter = ["cause"]
    list_select_related = ["rule"]
