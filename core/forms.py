"""What every app's forms share."""

from __future__ import annotations

from django import forms


def service_error_to_form(form: forms.Form, exc: Exception) -> None:
    """Attach a service's refusal to the field it is about (core.errors.FieldError), else to
    the form."""
    field = getattr(exc, "field", None)
    if isinstance(field, str) and field in form.fields:
        form.add_error(field, str(getattr(exc, "problem", exc)))
    else:
        form.add_error(None, str(exc))
