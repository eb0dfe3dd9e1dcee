from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from repos.errors import InvalidRepository
from repos.models import Repository
from repos.services import environment_check


class RepositoryAdminForm(forms.ModelForm[Repository]):
    class Meta:
        model = Repository
        fields = ["verify_commands", "environment"]

    def clean_environment(self) -> str:
        try:
            return environment_check(self.cleaned_data.get("environment") or "")
        except InvalidRepository as exc:
            raise forms.ValidationError(str(exc)) from None


@admin.register(Repository)
class RepositoryAdmin(admin.ModelAdmin[Repository]):
    """Registered through `manage.py repos add`, the Repositories page or the API, which check
    the location and branch against git; here: its verify commands and environment."""

    form = RepositoryAdminForm
    list_display = ("name", "location", "target_branch", "is_default", "removed_at")
    list_filter = ("is_default",)
    search_fields = ("name", "location")
    readonly_fields = (
        "name",
        "location",
        "target_branch",
        "is_default",
        "created_at",
        "updated_at",
        "removed_at",
    )

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
