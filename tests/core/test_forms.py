"""A service's refusal lands beside the field the error carries, whatever its message says."""

from __future__ import annotations

from django import forms

from autopilot.errors import InvalidGoal
from core.forms import service_error_to_form
from quanta.errors import InvalidQuantum


class TitleForm(forms.Form):
    title = forms.CharField()
    body = forms.CharField(required=False)


def test_it_puts_the_problem_beside_the_field_the_error_names() -> None:
    form = TitleForm({"title": "x"})
    assert form.is_valid()
    error = InvalidQuantum("at most 3: characters", field="title")
    assert str(error) == "title: at most 3: characters"  # what the API and the CLI say
    service_error_to_form(form, error)
    assert form.errors == {"title": ["at most 3: characters"]}


def test_a_message_that_only_looks_like_a_field_stays_on_the_form() -> None:
    form = TitleForm({"title": "x"})
    assert form.is_valid()
    service_error_to_form(form, InvalidGoal("body: is what the reviewer said"))
    service_error_to_form(form, InvalidGoal("no such thing", field="budget_usd"))
    assert form.errors == {
        "__all__": ["body: is what the reviewer said", "budget_usd: no such thing"]
    }
