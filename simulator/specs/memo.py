"""What a frozen object derives, remembered per object for hot paths that ask for it again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

PER_OBJECT_LIMIT = 1024
"""Objects one table remembers; past it, it starts afresh."""


def per_object(table: dict[int, tuple[Any, Any]], obj: Any, make: Callable[[], T]) -> T:
    """`make()` for `obj`, made once per object: `table` maps id(obj) to (obj, what it made),
    the object kept so that its id stays its own while it is there."""
    held = table.get(id(obj))
    if held is None or held[0] is not obj:
        if len(table) >= PER_OBJECT_LIMIT:
            table.clear()
        held = table[id(obj)] = (obj, make())
    return held[1]
