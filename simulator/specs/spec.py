"""The base of every spec: numbers are numbers.

YAML reads `true` as a bool and `.nan` / `.inf` as floats, and pydantic would take `true` for
1 and carry NaN into arithmetic. A spec refuses both: a bool where a number belongs and a
number that is not finite, each naming the field.
"""

from __future__ import annotations

import types
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, model_validator

NUMBERS = (int, float)


def _numeric(annotation: Any) -> bool:
    """Whether a field's type is a number (or an optional one)."""
    if annotation in NUMBERS:
        return True
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return bool(args) and all(a in NUMBERS for a in args)
    return False


class Spec(BaseModel):
    """A frozen spec with no unknown keys, no bool for a number and no NaN or infinity."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _numbers_not_bools(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, field in cls.model_fields.items():
                value = data.get(name)
                if isinstance(value, bool) and _numeric(field.annotation):
                    raise ValueError(f"{name}={str(value).lower()} must be a number, not "
                                     "true/false")
        return data
