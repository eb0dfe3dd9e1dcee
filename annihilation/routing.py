"""Websocket routes. Each app's consumers are added here as the UI grows."""

from __future__ import annotations

from typing import Any

from django.urls import path

from annihilation.consumers import EventConsumer

websocket_urlpatterns: list[Any] = [
    path("ws/events/", EventConsumer.as_asgi()),
]
