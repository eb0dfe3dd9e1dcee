"""The alerts in the admin: read-only (the alerter's tick writes them)."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from operations.models import Alert, AlertTransition


class AlertTransitionInline(admin.TabularInline[AlertTransition, Alert]):
    model = AlertTransition
    extra = 0
    can_delete = False
    readonly_fields = ("status", "value", "message", "created_at")
    ordering = ("-created_at",)

    def has_add_permission(self, request: HttpRequest, obj: Alert | None = None) -> bool:
        return False


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin[Alert]):
    list_display = ("rule", "status", "value", "threshold", "fired_at", "resolved_at", "fire_count")
    list_filter = ("status",)
    readonly_fields = (
        "rule",
        "status",
        "value",
        "threshold",
        "message",
        "fired_at",
        "resolved_at",
        "fire_count",
    )
    inlines = [AlertTransitionInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Alert | None = None) -> bool:
        return False
