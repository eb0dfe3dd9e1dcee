"""The Tether's pages, one module each: reachings (the Tether page: questions and drifts),
drifts (deciding a drift there), grounding (change reviews and pipeline proposals), changes (one
change), and actions (the same decisions over the websocket).

Importing the package imports the modules that register live pages and websocket actions
(core.live): the routing imports it before any websocket connects.
"""

from __future__ import annotations

from tether.views import actions, changes, drifts, grounding, reachings

__all__ = ["actions", "changes", "drifts", "grounding", "reachings"]
