from __future__ import annotations

from django.contrib import admin

from repos.models import Repository


@admin.register(Repository)
class RepositoryAdmin(admin.ModelAdmin[Repository]):
    list_display = ("name", "location", "target_branch", "is_default", "removed_at")
    list_filter = ("is_default",)
    search_fields = ("name", "location")
    readonly_fields = ("is_default", "created_at", "updated_at", "removed_at")
