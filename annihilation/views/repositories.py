"""The Repositories page: the registry of repositories agents work on, registering one and
removing one, and each repository's failed environment build with its redacted log."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from core.access import operator_required
from psychonauts.environments.errors import EnvironmentNotFound
from psychonauts.environments.selectors import environments_failed
from psychonauts.environments.services import build_get
from psychonauts.workspaces.registration import repository_inspect
from repos.errors import InvalidRepository, RepositoryError
from repos.selectors import repositories_list
from repos.services import (
    ENVIRONMENT_MAX_CHARS,
    repository_as_data,
    repository_create,
    repository_default,
    repository_remove,
)


class RepositoryForm(forms.Form):
    name = forms.CharField(max_length=63)
    location = forms.CharField(
        max_length=1000, help_text="a local git repository's absolute path, or its URL"
    )
    target_branch = forms.CharField(
        max_length=255, required=False, help_text="empty: the branch checked out"
    )
    verify_commands = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}), required=False, help_text="one per line"
    )
    environment = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 5}),
        required=False,
        max_length=ENVIRONMENT_MAX_CHARS,
        help_text="the environment declaration: YAML or JSON",
    )


def _field_of(message: str) -> str | None:
    """The form field an InvalidRepository message is about (None: the whole form)."""
    for prefix, field in (
        ("name", "name"),
        ("a repository named", "name"),
        ("the environment", "environment"),
        ("branch", "target_branch"),
        ("a verify command", "verify_commands"),
        ("verify commands", "verify_commands"),
    ):
        if message.startswith(prefix):
            return field
    return "target_branch" if "branch" in message else "location"


def _page(
    request: HttpRequest, form: RepositoryForm | None = None, status: int = 200
) -> HttpResponse:
    repository_default()  # ANNIHILATION_REPO is always listed
    failures = {f.repository: f for f in environments_failed()}
    rows = [
        {
            **repository_as_data(r),
            "open_quanta": int(getattr(r, "open_quanta", 0)),
            "environment_failure": failures.get(r.name),
        }
        for r in repositories_list()
    ]
    return render(
        request,
        "annihilation/repositories.html",
        {"rows": rows, "form": form or RepositoryForm()},
        status=status,
    )


def repositories_page(request: HttpRequest) -> HttpResponse:
    return _page(request)


@require_POST
@operator_required
def repository_add(request: HttpRequest) -> HttpResponse:
    form = RepositoryForm(request.POST)
    if not form.is_valid():
        return _page(request, form, status=400)
    data = form.cleaned_data
    try:
        repository = repository_create(
            name=data["name"],
            location=data["location"],
            target_branch=data["target_branch"],
            verify_commands=data["verify_commands"].splitlines(),
            environment=data["environment"],
            inspect=repository_inspect,
        )
    except InvalidRepository as exc:
        form.add_error(_field_of(str(exc)), str(exc))
        return _page(request, form, status=400)
    messages.success(request, f"Added repository {repository.name}.")
    return redirect("repositories")


@require_POST
@operator_required
def repository_remove_view(request: HttpRequest, name: str) -> HttpResponse:
    try:
        repository_remove(name=name)
    except RepositoryError as exc:
        messages.error(request, str(exc))
        return _page(request, status=409)
    messages.success(request, f"Removed repository {name}.")
    return redirect("repositories")


def environment_log(request: HttpRequest, build_id: int) -> HttpResponse:
    """An environment build's setup output as plain text (redacted when it was recorded)."""
    try:
        build = build_get(build_id)
    except EnvironmentNotFound as exc:
        raise Http404(str(exc)) from None
    return HttpResponse(build.log or "(no output)", content_type="text/plain; charset=utf-8")
