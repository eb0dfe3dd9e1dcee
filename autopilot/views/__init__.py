"""The autopilot's pages: goals (the list with its create form, one goal) and the hub (its
history page, and the pause / resume / force actions of its card).

Importing the package imports the modules that register live pages (core.live): the routing
imports it before any websocket connects.
"""

from __future__ import annotations

from autopilot.views import goals, hub

__all__ = ["goals", "hub"]
