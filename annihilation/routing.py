"""Websocket routes: the events consumer every live page connects to."""

from __future__ import annotations

from typing import Any

from django.urls import path

# The views modules register their live pages and websocket actions (core.live) on
# import; a websocket may connect before any HTTP request has loaded the URLconf.
import annihilation.views.dashboard
import annihilation.views.quantum  # noqa: F401
import autopilot.views  # noqa: F401
import bursts.views  # noqa: F401
import psychonauts.views  # noqa: F401
import quanta.views  # noqa: F401
import tether.views  # noqa: F401
from core.consumers import EventConsumer

websocket_urlpatterns: list[Any] = [
    path("ws/events/", EventConsumer.as_asgi()),
]
