"""Pipelines are editable here; any change bumps the version, and runs keep their snapshots."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import F
from django.forms import BaseInlineFormSet, ModelForm
from django.http import HttpRequest

from quanta.pipeline_models import Pipeline, Stage


class StageInline(admin.TabularInline[Stage, Pipeline]):
    model = Stage
    extra = 0
    ordering = ["index"]


@admin.register(Pipeline)
class PipelineAdmin(admin.ModelAdmin[Pipeline]):
    list_display = ["name", "is_default", "version", "description", "updated_at"]
    list_filter = ["is_default"]
    search_fields = ["name", "description"]
    readonly_fields = ["version", "source", "updated_at"]
    inlines = [StageInline]

    def save_related(
        self,
        request: HttpRequest,
        form: ModelForm[Pipeline],
        formsets: list[BaseInlineFormSet[Any, Any, Any]],
        change: bool,
    ) -> None:
        super().save_related(request, form, formsets, change)
        if change and (form.has_changed() or any(fs.has_changed() for fs in formsets)):
            Pipeline.objects.filter(pk=form.instance.pk).update(version=F("version") + 1)
