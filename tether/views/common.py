"""What the Tether's pages share: forms bound per listed item."""

from __future__ import annotations

from typing import Any

from django import forms

Bound = tuple[str, int, forms.Form]  # (form name, item id, the bound form with its errors)


def item_form(cls: type[forms.Form], prefix: str, pk: int, data: Any = None) -> forms.Form:
    """A form whose field ids are unique on a page listing many items."""
    return cls(data, auto_id=f"id_{prefix}{pk}_%s")


def form_pick(bound: Bound | None, name: str, pk: int, cls: type[forms.Form]) -> forms.Form:
    """The bound form when it is this item's (re-rendered with its errors), else a fresh one."""
    if bound is not None and bound[0] == name and bound[1] == pk:
        return bound[2]
    return item_form(cls, name, pk)
