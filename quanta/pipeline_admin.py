"""Pipelines are editable here; any change bumps the version, and runs keep their snapshots.
Making a pipeline the default is refused while another one is: the operator unticks the old
default first, so the default never changes as a side effect of another edit."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import ValidationError
from django.forms import BaseInlineFormSet, ModelForm
from django.http import HttpRequest

from quanta.pipeline_models import Pipeline, Stage
from quanta.pipelines.services import pipeline_version_bump


class StageInline(admin.TabularInline[Stage, Pipeline]):
    model = Stage
    extra = 0
    ordering = ["index"]


class PipelineForm(ModelForm[Pipeline]):
    class Meta:
        model = Pipeline
        fields = ["name", "description", "match_labels", "match_kinds", "is_default"]

    def clean_is_default(self) -> bool:
        value = bool(self.cleaned_data.get("is_default"))
        current = (
            Pipeline.objects.filter(is_default=True)
            .exclude(pk=self.instance.pk)
            .values_list("name", flat=True)
            .first()
        )
        if value and current is not None:
            raise ValidationError(
                f"{current!r} is the default pipeline: untick it there first (there is one default)."
            )
        return value


@admin.register(Pipeline)
class PipelineAdmin(admin.ModelAdmin[Pipeline]):
    form = PipelineForm
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
            pipeline_version_bump(pipeline_id=form.instance.pk)
