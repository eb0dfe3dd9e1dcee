"""Forms of the Tether and Grounding pages. The services check the same things again (an empty
answer or reason is `InvalidInput`); the forms only put the message next to the field."""

from __future__ import annotations

from django import forms


def _text(rows: int, placeholder: str) -> forms.Textarea:
    return forms.Textarea(attrs={"rows": rows, "placeholder": placeholder})


class AnswerForm(forms.Form):
    text = forms.CharField(
        label="Answer",
        max_length=10_000,
        widget=_text(2, "your answer"),
        error_messages={"required": "Write an answer."},
    )


class DriftGroundForm(forms.Form):
    comment = forms.CharField(label="Comment", required=False, max_length=5_000)


class DriftRejectForm(forms.Form):
    reason = forms.CharField(
        label="Why is the assumption wrong?",
        max_length=10_000,
        widget=_text(2, "the correction: it becomes a correction quantum"),
        error_messages={"required": "Say why the assumption is wrong."},
    )


class DriftNoteForm(forms.Form):
    text = forms.CharField(
        label="Note",
        max_length=5_000,
        widget=_text(1, "a note; the drift stays as it is"),
        error_messages={"required": "Write the note."},
    )


class ChangeRejectForm(forms.Form):
    reason = forms.CharField(
        label="Why reject it?",
        max_length=10_000,
        widget=_text(2, "the quantum is reopened with this as a comment"),
        error_messages={"required": "Say why the change is rejected."},
    )


class MutationRejectForm(forms.Form):
    reason = forms.CharField(label="Reason", required=False, max_length=5_000)
