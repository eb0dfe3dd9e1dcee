from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from quanta.models import Comment, Dependency, Quantum


class DependencyInline(admin.TabularInline[Dependency, Quantum]):
    model = Dependency
    fk_name = "quantum"
    extra = 0
    raw_id_fields = ["depends_on"]


class CommentInline(admin.TabularInline[Comment, Quantum]):
    model = Comment
    extra = 0
    readonly_fields = ["created_at"]


@admin.register(Quantum)
class QuantumAdmin(admin.ModelAdmin[Quantum]):
    list_display = [
        "id",
        "title",
        "kind",
        "status",
        "priority",
        "labels",
        "complexity",
        "complexity_auto",
        "updated_at",
    ]
    list_filter = ["status", "kind", "priority", "complexity", "complexity_auto"]
    search_fields = ["title", "body"]
    raw_id_fields = ["parent"]
    # Status changes go through the services (guarded transitions), never a free edit.
    readonly_fields = ["status", "close_reason", "created_at", "updated_at", "closed_at"]
    inlines = [DependencyInline, CommentInline]
    list_per_page = 50

    def save_model(self, request: HttpRequest, obj: Quantum, form: Any, change: bool) -> None:
        # A complexity chosen here is the operator's: the classifier leaves it alone from then on.
        if "complexity" in form.changed_data:
            obj.complexity_auto = False
        super().save_model(request, obj, form, change)


@admin.register(Dependency)
class DependencyAdmin(admin.ModelAdmin[Dependency]):
    list_display = ["id", "quantum", "kind", "depends_on", "created_at"]
    list_filter = ["kind"]
    raw_id_fields = ["quantum", "depends_on"]
    list_select_related = ["quantum", "depends_on"]
    search_fields = ["quantum__title", "depends_on__title"]


@admin.register(Comment)
class CommentAdmin(admin.ModelAdmin[Comment]):
    list_display = ["id", "quantum", "author_kind", "author", "created_at"]
    list_filter = ["author_kind"]
    search_fields = ["body", "author"]
    raw_id_fields = ["quantum"]
    list_select_related = ["quantum"]
    readonly_fields = ["created_at"]


from quanta import pipeline_admin  # noqa: E402, F401  (Pipeline and Stage)
