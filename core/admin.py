from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest

from core.models import Event, Session


class ReadOnly:
    """A ledger in the admin: no add, no change, no delete; every field shown read-only. Mix it
    in before ModelAdmin."""

    def has_add_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin[Session]):
    list_display = ["id", "kind", "ref", "title", "started_at", "ended_at"]
    list_filter = ["kind"]
    search_fields = ["ref", "title"]
    readonly_fields = ["started_at"]


@admin.register(Event)
class EventAdmin(admin.ModelAdmin[Event]):
    """Events are append-only: viewable, never editable."""

    list_display = ["id", "topic", "type", "session", "created_at"]
    list_filter = ["type", "session__kind"]
    search_fields = ["topic", "type"]
    readonly_fields = ["session", "topic", "type", "payload", "created_at"]
    list_select_related = ["session"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
