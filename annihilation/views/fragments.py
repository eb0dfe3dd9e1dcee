"""Rendered rows kept by what they show: a row of the dashboard's lists (an event, a live agent)
is the same HTML for the same values, so each process renders it once and reuses it.

The key is every value the row's template reads, so a cached row can never show an old value:
a changed value is a new key. Rows are small and the caches bounded (least recently used out).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from typing import Any

from django.template.loader import get_template
from django.utils.safestring import SafeString, mark_safe


class RowCache:
    """The HTML of one small template, by a key naming everything it shows."""

    def __init__(self, template_name: str, *, size: int) -> None:
        self.template_name = template_name
        self.size = size
        self._rows: OrderedDict[Hashable, SafeString] = OrderedDict()
        # Renders run in several threads (daphne's sync views, the live consumers' renders).
        self._lock = threading.Lock()

    def render(self, key: Hashable, context: Mapping[str, Any]) -> SafeString:
        with self._lock:
            html = self._rows.get(key)
            if html is not None:
                self._rows.move_to_end(key)
                return html
        html = mark_safe(get_template(self.template_name).render(dict(context)))
        with self._lock:
            self._rows[key] = html
            while len(self._rows) > self.size:
                self._rows.popitem(last=False)
        return html

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()
