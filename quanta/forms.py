"""Forms of the quanta pages. Fields are checked again by the services (quanta.fields), whose
messages name the field they are about (`title: must not be empty`), so they land next to it."""

from __future__ import annotations

from typing import Any

from django import forms

from quanta.errors import QuantaError
from quanta.models import Complexity, QuantumKind, QuantumStatus


def _words(value: str) -> list[str]:
    return [part.strip() for part in value.replace(",", " ").split() if part.strip()]


def service_error_to_form(form: forms.Form, exc: QuantaError) -> None:
    """Attach a service error to the field it names, else to the form."""
    message = str(exc)
    field, _, rest = message.partition(": ")
    if rest and field in form.fields:
        form.add_error(field, rest)
    else:
        form.add_error(None, message)


class QuantumForm(forms.Form):
    title = forms.CharField(max_length=500)
    body = forms.CharField(widget=forms.Textarea(attrs={"rows": 6}), required=False)
    kind = forms.ChoiceField(choices=QuantumKind.choices, initial=QuantumKind.TASK)
    priority = forms.IntegerField(min_value=0, max_value=4, initial=2, help_text="0 = critical")
    complexity = forms.ChoiceField(choices=Complexity.choices, initial=Complexity.STANDARD)
    labels = forms.CharField(required=False, help_text="comma separated")
    pipeline = forms.CharField(required=False, max_length=100, help_text="blank = matched")
    acceptance = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False)
    parent = forms.IntegerField(required=False, min_value=1, help_text="id of the parent quantum")

    def clean_labels(self) -> list[str]:
        return _words(self.cleaned_data["labels"])


class QuantumCreateForm(QuantumForm):
    depends_on = forms.CharField(
        required=False, help_text="ids of the quanta it waits on (comma separated)"
    )

    def clean_depends_on(self) -> list[int]:
        ids: list[int] = []
        for word in _words(self.cleaned_data["depends_on"]):
            if not word.lstrip("#").isdigit():
                raise forms.ValidationError(f"{word!r} is not a quantum id")
            ids.append(int(word.lstrip("#")))
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
    depends_on = forms.IntegerField(min_value=1, label="waits on quantum #")


class DependencyRemoveForm(forms.Form):
    depends_on = forms.IntegerField(min_value=1, label="stop waiting on quantum #")


class ImportForm(forms.Form):
    file = forms.FileField(help_text="YAML (a list of quanta) or JSON lines; all or nothing")


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
