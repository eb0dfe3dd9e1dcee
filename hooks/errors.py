from __future__ import annotations


class HooksError(Exception):
    """Base of the hooks app's errors."""


class WebhookRefused(HooksError):
    """An incoming delivery refused before anything is written: `status` is the HTTP status,
    `title` the problem's title and the message its detail."""

    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail = status, title, detail
