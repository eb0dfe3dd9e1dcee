from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from annihilation.access import operator_required
from annihilation.events import EventMessage
from annihilation.live import LivePageError, live_page
from annihilation.safetext import display_name
from annihilation.views import live_attrs
from bursts.selectors import pipeline_versions_used, quantum_runs
from psychonauts.selectors import roles_list
from quanta import services
from quanta.errors import BadSearchQuery, ImportFailed, QuantaError, QuantumNotFound
from quanta.forms import (
    AgentRunForm,
    CloseForm,
    CommentForm,
    DependencyForm,
    DependencyRemoveForm,
    ExportForm,
    ImportForm,
    PipelineLoadForm,
    QuantaFilterForm,
    QuantumCreateForm,
    QuantumForm,
    service_error_to_form,
)
from quanta.importer import quanta_import
from quanta.models import Quantum
from quanta.pipelines.loader import PipelineInvalid, pipelines_read
from quanta.pipelines.services import (
    DefaultPipelineTaken,
    known_roles,
    pipelines_list,
    pipelines_save,
)
from quanta.selectors import (
    EXPORT_FORMATS,
    Neighbourhood,
    quanta_browse,
    quanta_export,
    quantum_comments,
    quantum_get,
    quantum_neighbourhood,
    quantum_why_not_ready,
)
from tether.selectors import quantum_changes, quantum_drifts

# The neighbourhood picture: waits-on column, the quantum, waited-on-by column.
NODE_W, NODE_H, GAP, COL = 210, 34, 12, 300
# An import's problems shown under the form, like the first lines `quanta import` prints: a
# file with a problem on every line must not become a page of megabytes.
PROBLEMS_SHOWN = 50
_UNSAFE_NAME = re.compile(r"[^\w.+-]+")


def upload_name(raw: str) -> str:
    """The upload's base name, reduced to a safe file name that keeps its suffix (the importer
    tells YAML from JSON lines by it)."""
    name = PurePath(_UNSAFE_NAME.sub("_", display_name(PurePath(raw).name)))
    suffix = name.suffix if len(name.suffix) <= 10 else ""
    stem = name.stem.strip("._")[:80] or "upload"
    return stem + (suffix or ".yaml")


def _problems_to_form(form: Any, field: str, problems: list[str]) -> None:
    for problem in problems[:PROBLEMS_SHOWN]:
        form.add_error(field, problem)
    if len(problems) > PROBLEMS_SHOWN:
        form.add_error(field, f"… and {len(problems) - PROBLEMS_SHOWN} more")


def _quantum_or_404(quantum_id: int) -> Quantum:
    try:
        return quantum_get(quantum_id=quantum_id)
    except QuantumNotFound:
        raise Http404(f"no quantum #{quantum_id}") from None


def _index(
    request: HttpRequest, import_form: ImportForm | None = None, status: int = 200
) -> HttpResponse:
    form = QuantaFilterForm(request.GET or None)
    filters: dict[str, Any] = {}
    if form.is_valid():
        data = form.cleaned_data
        filters = {
            "query": data["q"],
            "status": data["status"] or None,
            "kind": data["kind"] or None,
            "priority": data["priority"],
            "label": data["label"].strip() or None,
        }
    try:
        qs = quanta_browse(**filters)
        page = Paginator(qs, settings.UI_PAGE_SIZE).get_page(request.GET.get("page"))
    except BadSearchQuery as exc:
        form.add_error("q", str(exc))
        page = Paginator(Quantum.objects.none(), settings.UI_PAGE_SIZE).get_page(1)
    query = request.GET.copy()
    query.pop("page", None)
    return render(
        request,
        "quanta/list.html",
        {
            "form": form,
            "page": page,
            "query": query.urlencode(),
            "import_form": import_form or ImportForm(),
            "export_formats": EXPORT_FORMATS,
        },
        status=status,
    )


def quanta_index(request: HttpRequest) -> HttpResponse:
    return _index(request)


@require_POST
@operator_required
def quanta_import_upload(request: HttpRequest) -> HttpResponse:
    """All or nothing, like `manage.py quanta import`: every problem is listed under the field."""
    form = ImportForm(request.POST, request.FILES)
    if not form.is_valid():
        return _index(request, form, status=400)
    upload = form.cleaned_data["file"]
    # The importer reads a path and names it in its messages (`file:line: field: why`): the
    # upload is written under its own base name in a private directory, removed afterwards.
    name = upload_name(upload.name or "")
    with tempfile.TemporaryDirectory(prefix="annihilation-import-") as tmp:
        path = Path(tmp) / name
        with path.open("wb") as out:
            for chunk in upload.chunks():
                out.write(chunk)
        try:
            ids = quanta_import(path=path)
        except ImportFailed as exc:
            form.add_error(None, f"import failed, nothing written ({len(exc.problems)} problems):")
            _problems_to_form(form, "file", exc.problems)
            return _index(request, form, status=400)
        except QuantaError as exc:
            form.add_error("file", str(exc))
            return _index(request, form, status=400)
    span = f" (#{ids[0]}..#{ids[-1]})" if ids else ""
    messages.success(request, f"Imported {len(ids)} quanta{span}.")
    return redirect("quanta")


def quanta_export_download(request: HttpRequest) -> HttpResponse:
    """The file `manage.py quanta export [--status S] [--format F]` writes, as a download."""
    form = ExportForm(request.GET)
    if not form.is_valid():
        return HttpResponse(
            "; ".join(f"{k}: {' '.join(str(m) for m in v)}" for k, v in form.errors.items()),
            status=400,
            content_type="text/plain; charset=utf-8",
        )
    fmt = form.cleaned_data["format"] or "yaml"
    text = quanta_export(status=form.cleaned_data["status"] or None, fmt=fmt)
    content_type = "application/x-ndjson" if fmt == "jsonl" else "application/yaml"
    response = HttpResponse(text, content_type=f"{content_type}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="quanta.{fmt}"'
    return response


def neighbourhood_svg(hood: Neighbourhood) -> dict[str, Any]:
    """Boxes and arrows for the template (presentation only; the edges come from the selector)."""
    rows = max(len(hood.upstream), len(hood.downstream), 1)
    height = rows * (NODE_H + GAP) + GAP
    centre_y = height / 2 - NODE_H / 2

    def column(items: list[Any], x: float) -> list[dict[str, Any]]:
        top = (height - len(items) * (NODE_H + GAP) + GAP) / 2
        return [
            {"n": n, "kind": kind, "x": x, "y": top + i * (NODE_H + GAP)}
            for i, (n, kind) in enumerate(items)
        ]

    up = column(hood.upstream, 10)
    down = column(hood.downstream, 10 + 2 * COL)
    centre_x = 10 + COL
    centre = {"n": hood.quantum, "x": centre_x, "y": centre_y}
    edges = [
        # An arrow from the dependent to what it waits on, labelled with the edge kind.
        {"x1": centre_x, "y1": centre_y + NODE_H / 2, "x2": u["x"] + NODE_W,
         "y2": u["y"] + NODE_H / 2, "kind": u["kind"]}
        for u in up
    ] + [
        {"x1": d["x"], "y1": d["y"] + NODE_H / 2, "x2": centre_x + NODE_W,
         "y2": centre_y + NODE_H / 2, "kind": d["kind"]}
        for d in down
    ]  # fmt: skip
    return {
        "up": up,
        "down": down,
        "centre": centre,
        "edges": edges,
        "width": 20 + 2 * COL + NODE_W,
        "height": height,
        "node_w": NODE_W,
        "node_h": NODE_H,
    }


def _detail_context(quantum_id: int) -> dict[str, Any]:
    quantum = _quantum_or_404(quantum_id)
    return {
        "quantum": quantum,
        "why": quantum_why_not_ready(quantum_id=quantum_id),
        "graph": neighbourhood_svg(quantum_neighbourhood(quantum_id=quantum_id)),
        "comments": quantum_comments(quantum_id=quantum_id),
        "runs": quantum_runs(quantum_id=quantum_id),
    }


def quantum_detail(request: HttpRequest, quantum_id: int) -> HttpResponse:
    context = _detail_context(quantum_id)
    return render(
        request,
        "quanta/detail.html",
        {
            **context,
            "comment_form": CommentForm(),
            "close_form": CloseForm(),
            "dependency_form": DependencyForm(),
            "dependency_remove_form": DependencyRemoveForm(),
            "agent_run_form": AgentRunForm(roles=list(roles_list().values_list("name", flat=True))),
            "drifts": quantum_drifts(quantum_id=quantum_id),
            "changes": quantum_changes(quantum_id=quantum_id),
            **live_attrs(["quanta", "burst:events"], "quantum", quantum_id=quantum_id),
        },
    )


@live_page("quantum")
def quantum_live(event: EventMessage, params: Mapping[str, str]) -> dict[str, Any]:
    try:
        quantum_id = int(params["quantum_id"])
    except (KeyError, ValueError):
        raise LivePageError("no quantum id") from None
    if event["payload"].get("quantum_id") != quantum_id:
        raise LivePageError("another quantum's event")
    try:
        return _detail_context(quantum_id)
    except Http404:
        raise LivePageError("quantum gone") from None


def _initial(quantum: Quantum) -> dict[str, Any]:
    return {
        "title": quantum.title,
        "body": quantum.body,
        "kind": quantum.kind,
        "priority": quantum.priority,
        "complexity": quantum.complexity,
        "labels": ", ".join(quantum.labels),
        "pipeline": quantum.pipeline,
        "acceptance": quantum.acceptance,
        "parent": quantum.parent_id,
    }


@operator_required
def quantum_create(request: HttpRequest) -> HttpResponse:
    form = QuantumCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = dict(form.cleaned_data)
        try:
            quantum = services.quantum_create(
                title=data["title"],
                body=data["body"],
                kind=data["kind"],
                priority=data["priority"],
                complexity=data["complexity"],
                labels=data["labels"],
                pipeline=data["pipeline"],
                acceptance=data["acceptance"],
                parent_id=data["parent"],
                depends_on=data["depends_on"],
            )
        except QuantaError as exc:
            service_error_to_form(form, exc)
        else:
            messages.success(request, f"Created #{quantum.pk}.")
            return redirect("quantum", quantum_id=quantum.pk)
    status = 400 if request.method == "POST" else 200
    return render(request, "quanta/form.html", {"form": form, "quantum": None}, status=status)


@operator_required
def quantum_edit(request: HttpRequest, quantum_id: int) -> HttpResponse:
    quantum = _quantum_or_404(quantum_id)
    form = QuantumForm(request.POST or None, initial=_initial(quantum))
    if request.method == "POST" and form.is_valid():
        data = dict(form.cleaned_data)
        parent = data.pop("parent")
        changes: Any = {k: v for k, v in data.items() if form.initial.get(k) != (
            ", ".join(v) if k == "labels" else v)}  # fmt: skip
        try:
            if changes or parent != quantum.parent_id:
                services.quantum_update(
                    quantum_id=quantum_id,
                    changes=changes,
                    parent_id=parent if parent != quantum.parent_id else None,
                    clear_parent=parent is None and quantum.parent_id is not None,
                )
        except QuantaError as exc:
            service_error_to_form(form, exc)
        else:
            messages.success(request, f"Saved #{quantum_id}.")
            return redirect("quantum", quantum_id=quantum_id)
    status = 400 if request.method == "POST" else 200
    return render(request, "quanta/form.html", {"form": form, "quantum": quantum}, status=status)


def _action_done(request: HttpRequest, quantum_id: int, action: Any, success: str) -> HttpResponse:
    """Run a service; a stale or refused action says why and changes nothing."""
    _quantum_or_404(quantum_id)
    try:
        action()
    except QuantaError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, success)
    return redirect("quantum", quantum_id=quantum_id)


@require_POST
@operator_required
def quantum_comment(request: HttpRequest, quantum_id: int) -> HttpResponse:
    form = CommentForm(request.POST)
    if not form.is_valid():
        messages.error(request, "A comment needs some text.")
        return redirect("quantum", quantum_id=quantum_id)
    return _action_done(
        request,
        quantum_id,
        lambda: services.comment_add(
            quantum_id=quantum_id,
            body=form.cleaned_data["body"],
            author=request.user.get_username(),
        ),
        "Comment added.",
    )


@require_POST
@operator_required
def quantum_close(request: HttpRequest, quantum_id: int) -> HttpResponse:
    form = CloseForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Closing needs a reason.")
        return redirect("quantum", quantum_id=quantum_id)
    return _action_done(
        request,
        quantum_id,
        lambda: services.quantum_close(quantum_id=quantum_id, reason=form.cleaned_data["reason"]),
        f"Closed #{quantum_id}.",
    )


@require_POST
@operator_required
def quantum_reopen(request: HttpRequest, quantum_id: int) -> HttpResponse:
    return _action_done(
        request,
        quantum_id,
        lambda: services.quantum_reopen(quantum_id=quantum_id),
        f"Reopened #{quantum_id}.",
    )


@require_POST
@operator_required
def quantum_defer(request: HttpRequest, quantum_id: int) -> HttpResponse:
    return _action_done(
        request,
        quantum_id,
        lambda: services.quantum_defer(quantum_id=quantum_id),
        f"Deferred #{quantum_id}.",
    )


@require_POST
@operator_required
def quantum_dependency_add(request: HttpRequest, quantum_id: int) -> HttpResponse:
    form = DependencyForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Give the id of the quantum it waits on.")
        return redirect("quantum", quantum_id=quantum_id)
    return _action_done(
        request,
        quantum_id,
        lambda: services.dependency_add(
            quantum_id=quantum_id, depends_on_id=form.cleaned_data["depends_on"]
        ),
        f"#{quantum_id} now waits on #{form.cleaned_data['depends_on']}.",
    )


@require_POST
@operator_required
def quantum_dependency_remove(request: HttpRequest, quantum_id: int) -> HttpResponse:
    form = DependencyRemoveForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Give the id of the quantum it should stop waiting on.")
        return redirect("quantum", quantum_id=quantum_id)
    return _action_done(
        request,
        quantum_id,
        lambda: services.dependency_remove(
            quantum_id=quantum_id, depends_on_id=form.cleaned_data["depends_on"]
        ),
        f"#{quantum_id} no longer waits on #{form.cleaned_data['depends_on']}.",
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
            _problems_to_form(form, "yaml", problems)
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
