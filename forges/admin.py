from __future__ import annotations

from django.contrib import admin

from forges.models import ForgeRepository, PullRequest


@admin.register(ForgeRepository)
class ForgeRepositoryAdmin(admin.ModelAdmin[ForgeRepository]):
    list_display = ("repository", "kind", "slug", "webhook", "merge_method")


@admin.register(PullRequest)
class PullRequestAdmin(admin.ModelAdmin[PullRequest]):
    list_display = ("repository", "branch", "number", "state", "change", "synced_at")
    list_filter = ("state",)
    readonly_fields = [f.name for f in PullRequest._meta.fields]

    def has_add_permission(self, request: object) -> bool:
        return False
