"""Forms of the quanta pages. Fields are checked again by the services (quanta.fields), whose
errors carry the field they are about (core.errors.FieldError), so they land next to it."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.core.files.uploadedfile import UploadedFile

from quanta.errors import InvalidQuantum
from quanta.fields import COMPLEXITY_AUTO, clean_commands
from quanta.models import Complexity, QuantumKind, QuantumStatus


def _words(value: str) -> list[str]:
    return [part.strip() for part in value.replace(",", " ").split() if part.strip()]


ID_MAX = 2**63 - 1  # ids are bigints


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def _size_error(size: int) -> forms.ValidationError:
    limit = settings.IMPORT_MAX_BYTES
    return forms.ValidationError(
        f"{_mib(size)} is over the import limit of {_mib(limit)} (ANNIHILATION_IMPORT_MAX_BYTES)"
    )


class QuantumForm(forms.Form):
    title = forms.CharField(max_length=500)
    body = forms.CharField(widget=forms.Textarea(attrs={"rows": 6}), required=False)
    kind = forms.ChoiceField(choices=QuantumKind.choices, initial=QuantumKind.TASK)
    priority = forms.IntegerField(min_value=0, max_value=4, initial=2, help_text="0 = critical")
    complexity = forms.ChoiceField(
        choices=[(COMPLEXITY_AUTO, "auto (classified from the text)"), *Complexity.choices],
        initial=COMPLEXITY_AUTO,
        help_text="auto: set from the title and body, and again when they change",
    )
    labels = forms.CharField(required=False, help_text="comma separated")
    pipeline = forms.CharField(required=False, max_length=100, help_text="blank = matched")
    acceptance = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False)
    verify_commands = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        required=False,
        label="verify commands",
        help_text="one command per line, run after the implementing stage (e.g. pytest -q)",
    )
    parent = forms.IntegerField(
        required=False, min_value=1, max_value=ID_MAX, help_text="id of the parent quantum"
    )

    def clean_labels(self) -> list[str]:
        return _words(self.cleaned_data["labels"])

    def clean_verify_commands(self) -> list[str]:
        # Checked here too (the service checks again) so that a refused command shows beside
        # the form's other problems, not after they are fixed.
        lines = [line.strip() for line in self.cleaned_data["verify_commands"].splitlines()]
        try:
            return clean_commands([line for line in lines if line])
        except InvalidQuantum as exc:
            raise forms.ValidationError(exc.problem) from None


class QuantumCreateForm(QuantumForm):
    depends_on = forms.CharField(
        required=False, help_text="ids of the quanta it waits on (comma separated)"
    )

    def clean_depends_on(self) -> list[int]:
        ids: list[int] = []
        for word in _words(self.cleaned_data["depends_on"]):
            digits = word.lstrip("#")
            if not (digits.isascii() and digits.isdigit()) or not 0 < int(digits) <= ID_MAX:
                raise forms.ValidationError(f"{word[:30]!r} is not a quantum id")
            ids.append(int(digits))
        return ids


class QuantaFilterForm(forms.Form):
    q = forms.CharField(required=False, label="search")
    status = forms.ChoiceField(choices=[("", "any status"), *QuantumStatus.choices], required=False)
    kind = forms.ChoiceField(choices=[("", "any kind"), *QuantumKind.choices], required=False)
    priority = forms.TypedChoiceField(
        choices=[("", "any priority"), *((str(p), f"P{p}") for p in range(5))],
        coerce=int,
        empty_value=None,
        required=False,
    )
    label = forms.CharField(required=False)


class CommentForm(forms.Form):
    body = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}))


class CloseForm(forms.Form):
    reason = forms.CharField(max_length=1000)


class DependencyForm(forms.Form):
    depends_on = forms.IntegerField(min_value=1, max_value=ID_MAX, label="waits on quantum #")


class DependencyRemoveForm(forms.Form):
    depends_on = forms.IntegerField(
        min_value=1, max_value=ID_MAX, label="stop waiting on quantum #"
    )


class ImportForm(forms.Form):
    file = forms.FileField(help_text="YAML (a list of quanta) or JSON lines; all or nothing")

    def clean_file(self) -> UploadedFile[Any]:
        upload: UploadedFile[Any] = self.cleaned_data["file"]
        if (upload.size or 0) > settings.IMPORT_MAX_BYTES:
            raise _size_error(upload.size or 0)
        return upload


class ExportForm(forms.Form):
    format = forms.ChoiceField(choices=[("yaml", "YAML"), ("jsonl", "JSON lines")], required=False)
    status = forms.ChoiceField(choices=[("", "any status"), *QuantumStatus.choices], required=False)


class AgentRunForm(forms.Form):
    """One agent outside a wave (`manage.py psychonaut run`); roles are read from the DB."""

    role = forms.ChoiceField(choices=[])
    context = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}), required=False, help_text="extra for the prompt"
    )

    def __init__(self, *args: Any, roles: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["role"].choices = [(name, name) for name in roles]  # type: ignore[attr-defined]


class PipelineLoadForm(forms.Form):
    yaml = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 10, "spellcheck": "false"}),
        label="pipeline YAML",
        help_text="one pipeline, a list, or `pipelines:` and a list (the files in pipelines/)",
    )
    replace_default = forms.BooleanField(
        required=False,
        label="replace the current default pipeline",
        help_text="needed when the YAML marks a pipeline `default: true` and another is the default",
    )

    def clean_yaml(self) -> str:
        text: str = self.cleaned_data["yaml"]
        size = len(text.encode("utf-8", "replace"))
        if size > settings.IMPORT_MAX_BYTES:
            raise _size_error(size)
        return text


# A file's problems shown under the form, like the first lines `quanta import` prints: a
# file with a problem on every line must not become a page of megabytes.
PROBLEMS_SHOWN = 50


def problems_to_form(form: forms.Form, field: str, problems: list[str]) -> None:
    """Problems of a file or pasted text under the form's field, at most PROBLEMS_SHOWN."""
    for problem in problems[:PROBLEMS_SHOWN]:
        form.add_error(field, problem)
    if len(problems) > PROBLEMS_SHOWN:
        form.add_error(field, f"… and {len(problems) - PROBLEMS_SHOWN} more")
