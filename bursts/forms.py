from __future__ import annotations

from typing import Any

from django import forms

from quanta.errors import InvalidQuantum
from quanta.fields import clean_labels
from repos.models import Repository


def split_labels(value: str) -> list[str]:
    return [part.strip() for part in value.replace(",", " ").split() if part.strip()]


class WaveStartForm(forms.Form):
    labels = forms.CharField(
        required=False,
        help_text="scope: quanta carrying any of these labels (comma separated); empty = all",
    )
    continuous = forms.BooleanField(
        required=False, help_text="one rolling burst: start whatever becomes ready at once"
    )
    repository = forms.ModelChoiceField(
        queryset=Repository.objects.filter(removed_at__isnull=True).order_by("-is_default", "name"),
        required=False,
        empty_label="default",
        to_field_name="name",
        help_text="whose ready quanta",
    )

    def clean_labels(self) -> list[str]:
        try:
            return clean_labels(split_labels(self.cleaned_data["labels"]))
        except InvalidQuantum as exc:
            raise forms.ValidationError(exc.problem) from None


class WaveCancelForm(forms.Form):
    wave_id = forms.IntegerField(min_value=1, widget=forms.HiddenInput)
    reason = forms.CharField(required=False, max_length=500)

    def clean_reason(self) -> str:
        value: Any = self.cleaned_data["reason"]
        return str(value).strip() or "cancelled by the operator"
