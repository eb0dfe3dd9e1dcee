"""The pipelines page: every pipeline with the versions runs used, and loading pasted YAML."""

from __future__ import annotations

import tempfile
from pathlib import Path

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from bursts.selectors import pipeline_versions_used
from core.access import operator_required
from quanta.forms import PipelineLoadForm, problems_to_form
from quanta.pipelines.loader import PipelineInvalid, pipelines_read
from quanta.pipelines.services import (
    DefaultPipelineTaken,
    known_roles,
    pipelines_list,
    pipelines_save,
)


def _pipelines_page(
    request: HttpRequest, load_form: PipelineLoadForm | None = None, status: int = 200
) -> HttpResponse:
    used = pipeline_versions_used()
    rows = [{"pipeline": p, "versions": used.get(p.name, [])} for p in pipelines_list()]
    return render(
        request,
        "quanta/pipelines.html",
        {"rows": rows, "load_form": load_form or PipelineLoadForm()},
        status=status,
    )


def pipelines(request: HttpRequest) -> HttpResponse:
    return _pipelines_page(request)


PASTED = "pasted.yaml"


@require_POST
@operator_required
def pipelines_load_pasted(request: HttpRequest) -> HttpResponse:
    """`manage.py pipelines load FILE` for pasted YAML: all or nothing, every problem listed."""
    form = PipelineLoadForm(request.POST)
    if not form.is_valid():
        return _pipelines_page(request, form, status=400)
    # The loader reads files (and checks duplicate names and defaults across them): the text is
    # written to a private temporary file; its path is replaced by a readable name in the
    # problems and in the pipelines' recorded source.
    source = f"{PASTED} (web, {request.user.get_username()})"
    with tempfile.TemporaryDirectory(prefix="annihilation-pipeline-") as tmp:
        path = Path(tmp) / PASTED
        path.write_text(form.cleaned_data["yaml"], encoding="utf-8")
        try:
            specs = pipelines_read([path], roles=known_roles())
        except PipelineInvalid as exc:
            problems = [problem.replace(str(path), PASTED) for problem in exc.problems]
            problems_to_form(form, "yaml", problems)
            return _pipelines_page(request, form, status=400)
    try:
        loaded = pipelines_save(
            specs=[(source, spec) for _, spec in specs],
            replace_default=form.cleaned_data["replace_default"],
        )
    except DefaultPipelineTaken as exc:
        form.add_error(
            "replace_default",
            f"{exc.new!r} would replace {exc.current!r} as the default pipeline: tick this "
            "to confirm, and load again. Nothing was loaded.",
        )
        return _pipelines_page(request, form, status=400)
    summary = ", ".join(f"{x.name} v{x.version} ({x.change})" for x in loaded)
    messages.success(request, f"Loaded {summary}.")
    return redirect("pipelines")
