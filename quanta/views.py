from __future__ import annotations

import re
import tempfile
from pathlib import Path, PurePath
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from core.access import operator_required
from core.forms import service_error_to_form
from core.safetext import display_name
from quanta import services
from quanta.errors import BadSearchQuery, ImportFailed, QuantaError, QuantumNotFound
from quanta.fields import COMPLEXITY_AUTO
from quanta.forms import (
    CloseForm,
    CommentForm,
    DependencyForm,
    DependencyRemoveForm,
    ExportForm,
    ImportForm,
    QuantaFilterForm,
    QuantumCreateForm,
    QuantumForm,
    problems_to_form,
)
from quanta.importer import quanta_import_report
from quanta.models import Quantum
from quanta.selectors import (
    quanta_browse,
    quantum_get,
)
from quanta.serializers import EXPORT_FORMATS, quanta_export

_UNSAFE_NAME = re.compile(r"[^\w.+-]+")


def upload_name(raw: str) -> str:
    """The upload's base name, reduced to a safe file name that keeps its suffix (the importer
    tells YAML from JSON lines by it)."""
    name = PurePath(_UNSAFE_NAME.sub("_", display_name(PurePath(raw).name)))
    suffix = name.suffix if len(name.suffix) <= 10 else ""
    stem = name.stem.strip("._")[:80] or "upload"
    return stem + (suffix or ".yaml")


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
            report = quanta_import_report(path=path)
        except ImportFailed as exc:
            form.add_error(None, f"import failed, nothing written ({len(exc.problems)} problems):")
            problems_to_form(form, "file", exc.problems)
            return _index(request, form, status=400)
        except QuantaError as exc:
            form.add_error("file", str(exc))
            return _index(request, form, status=400)
    messages.success(request, report.describe().capitalize() + ".")
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


def _initial(quantum: Quantum) -> dict[str, Any]:
    return {
        "title": quantum.title,
        "body": quantum.body,
        "kind": quantum.kind,
        "priority": quantum.priority,
        "complexity": COMPLEXITY_AUTO if quantum.complexity_auto else quantum.complexity,
        "labels": ", ".join(quantum.labels),
        "pipeline": quantum.pipeline,
        "acceptance": quantum.acceptance,
        "verify_commands": "\n".join(quantum.verify_commands),
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
                verify_commands=data["verify_commands"],
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
        shown = {"labels": ", ".join, "verify_commands": "\n".join}  # lists as the form shows them
        changes: Any = {k: v for k, v in data.items() if form.initial.get(k) != (
            shown[k](v) if k in shown else v)}  # fmt: skip
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
