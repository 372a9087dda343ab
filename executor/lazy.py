"""Tables of kinds whose classes are imported only when chosen (`--target`, `--flavor`)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from simulator.specs.errors import SpecError


def lazy_class(table: Mapping[str, str], name: str, what: str) -> Any:
    """The class `table[name]` names as "module:Class", imported now; SpecError naming the
    valid names (`what` is the kind, e.g. "target") when there is none."""
    if name not in table:
        raise SpecError(f"unknown {what} {name!r}; valid {what}s: {', '.join(table)}")
    module, _, cls = table[name].partition(":")
    return getattr(importlib.import_module(module), cls)
