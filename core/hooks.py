"""The one kind of extension point: a lower app declares a `Hook`, the apps above fill it.

A lower app never imports a higher one (tests/test_layers.py). Where it needs something from
above (a prompt section, what to do when runs drain, the agent runtime itself), it declares a
typed hook and calls what is registered in it; each app above registers its own from its
`hooks.py`, which its `AppConfig.ready()` imports. A reader follows a hook from its declaration
to the `hooks.py` modules that name it.

    ON_RUNS_DRAINED: Hook[RunsDrained] = Hook("bursts.runs_drained")
    ON_RUNS_DRAINED.register(runs_drained)         # tether/hooks.py
    for hook in ON_RUNS_DRAINED: hook(drained)     # bursts/services/drain.py

Items come back in the order they were registered, which is the order of INSTALLED_APPS (each
app's ready() in turn): the same in every process. Registering an item again (ready() may run
twice in tests) keeps its place; an item whose `key` is taken replaces the one there, in place.
A `single` hook holds at most one item (the agent runtime, the roles' source): registering
replaces it, `one()` reads it. Tests swap a hook's items for a block with `replaced(...)`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from core.errors import AnnihilationError

T = TypeVar("T")


class HookEmpty(AnnihilationError):
    """A single hook was read before any app registered its item in it."""


def _itself(item: object) -> Hashable:
    return item  # functions and frozen dataclasses hash: an item is its own key


class Hook(Generic[T]):
    """An ordered, typed set of items registered by the apps above the one that declares it."""

    def __init__(
        self, name: str, *, key: Callable[[T], Hashable] = _itself, single: bool = False
    ) -> None:
        self.name = name
        self._key = key
        self._single = single
        self._items: dict[Hashable, T] = {}

    def __repr__(self) -> str:
        return f"Hook({self.name!r}, {len(self._items)} registered)"

    def register(self, item: T) -> T:
        """Add `item` (or replace the item with its key, where that one stood). Returns it, so
        that it can decorate a function."""
        if self._single:
            self._items.clear()
        self._items[self._key(item)] = item
        return item

    def __iter__(self) -> Iterator[T]:
        # A copy: a hook that registers while the items run does not disturb the loop.
        return iter(tuple(self._items.values()))

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, item: object) -> bool:
        return any(found is item or found == item for found in self._items.values())

    def keys(self) -> tuple[Hashable, ...]:
        """The keys of the registered items, in their order."""
        return tuple(self._items)

    def get(self, key: Hashable) -> T | None:
        """The item registered under `key`, or None."""
        return self._items.get(key)

    def one(self) -> T:
        """The item of a single hook; HookEmpty when no app registered one."""
        for item in self._items.values():
            return item
        raise HookEmpty(f"nothing is registered in the hook {self.name!r}")

    @contextmanager
    def replaced(self, *items: T) -> Iterator[Hook[T]]:
        """For the block, exactly `items` (none: an empty hook); the registered items after it,
        whatever the block registered meanwhile. For tests."""
        saved = dict(self._items)
        self._items.clear()
        for item in items:
            self.register(item)
        try:
            yield self
        finally:
            self._items = saved
