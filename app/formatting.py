"""Small helpers that turn nested plain data into table rows and short text."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def flatten(obj: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys: {"decode": {"dep": 8}} -> {"decode.dep": 8}."""
    out: dict[str, Any] = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def show(value: Any) -> str:
    """A value for a table cell: '-' for None, floats to a readable precision."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"
    return str(value)
