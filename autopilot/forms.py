"""Forms of the Goals page and the autopilot card. The services check the same things again
(`InvalidGoal` carries the field it is about), so a refusal lands next to its field."""

from __future__ import annotations

from decimal import Decimal

from django import forms

from autopilot.models import Goal, GoalStatus, HubState
from quanta.errors import InvalidQuantum
from quanta.fields import clean_commands

TITLE_MAX = Goal._meta.get_field("title").max_length or 500
TEXT_MAX = 20_000  # characters of a description or of success criteria
BUDGET_MAX = Decimal("99999999")  # the column holds 12 digits, 4 after the point


def _words(value: str) -> list[str]:
    return [part.strip() for part in value.replace(",", " ").split() if part.strip()]


class GoalCreateForm(forms.Form):
    title = forms.CharField(
        max_length=TITLE_MAX, error_messages={"required": "A goal needs a title."}
    )
    description = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}), required=False, max_length=TEXT_MAX
    )
    success_criteria = forms.CharField(
        label="Success criteria",
        widget=forms.Textarea(attrs={"rows": 3}),
        max_length=TEXT_MAX,
        help_text="what must be true when the goal is done",
        error_messages={"required": "Say what must be true when the goal is done."},
    )
    verify_commands = forms.CharField(
        label="Verify commands",
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        required=False,
        help_text="one command per line, run on the integration branch once every quantum is merged",
    )
    priority = forms.IntegerField(min_value=0, max_value=4, initial=2, help_text="0 = critical")
    labels = forms.CharField(required=False, help_text="comma separated; its quanta carry them")
    budget_usd = forms.DecimalField(
        label="Budget (USD)",
        required=False,
        min_value=Decimal(0),
        max_value=BUDGET_MAX,
        decimal_places=4,
        help_text="what its agents may spend in all; blank = no limit of its own",
    )

    def clean_labels(self) -> list[str]:
        return _words(self.cleaned_data["labels"])

    def clean_verify_commands(self) -> list[str]:
        # Checked here too (the service checks again) so that a command the guard refuses shows
        # beside the form's other problems, not after they are fixed.
        lines = [line.strip() for line in self.cleaned_data["verify_commands"].splitlines()]
        try:
            return clean_commands([line for line in lines if line])
        except InvalidQuantum as exc:
            raise forms.ValidationError(exc.problem) from None


class GoalFilterForm(forms.Form):
    status = forms.ChoiceField(choices=[("", "any status"), *GoalStatus.choices], required=False)


class GoalAbandonForm(forms.Form):
    reason = forms.CharField(
        label="Reason",
        required=False,
        max_length=5_000,
        widget=forms.TextInput(attrs={"placeholder": "why abandon it (optional)"}),
    )


class HubPauseForm(forms.Form):
    reason = forms.CharField(label="Reason", required=False, max_length=1_000)


class HubForceForm(forms.Form):
    state = forms.ChoiceField(choices=HubState.choices)
