"""The base of every schema of user input: unlike plain pydantic, a number key refuses
true/false and a true/false key refuses numbers."""

from __future__ import annotations

from contextlib import suppress
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from heptstudy.config.yaml_text import as_yaml, parse_overrides
from heptstudy.errors import ConfigError


def _scalar_kind(annotation: Any) -> Any:
    """``int``, ``float`` or ``bool`` for a field of that scalar (or a list or tuple of it)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _scalar_kind(get_args(annotation)[0])
    if origin in (Union, UnionType):  # optional: X | None
        kinds = [a for a in get_args(annotation) if a is not type(None)]
        return _scalar_kind(kinds[0]) if len(kinds) == 1 else None
    if origin in (list, tuple):
        kinds = {_scalar_kind(a) for a in get_args(annotation) if a is not Ellipsis}
        return kinds.pop() if len(kinds) == 1 else None
    return annotation if annotation in (int, float, bool) else None


def _bool_mixup(kind: Any, value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_bool_mixup(kind, v) for v in value)
    if kind in (int, float):
        return isinstance(value, bool)
    return kind is bool and isinstance(value, (int, float)) and not isinstance(value, bool)


class StrictInput(BaseModel):
    """The schema of user input (configuration, measurement request); a string given for a
    number or true/false is read as a ``--set KEY=VALUE``'s VALUE is."""

    # NaN and the infinities refused: none is meant, and reports record configurations as JSON
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _booleans_are_not_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode turns true into 1 and 1 into true: a typo, never an intention
        field = cls.model_fields.get(info.field_name or "")
        kind = _scalar_kind(field.annotation) if field else None
        if kind is None:
            return value
        if isinstance(value, str):  # as the VALUE of KEY=VALUE; unreadable text stays
            with suppress(ConfigError):
                value = parse_overrides([f"value={value}"])["value"]
        if not _bool_mixup(kind, value):
            return value
        wanted = "true or false" if kind is bool else f"{'a whole' if kind is int else 'a'} number"
        got = "a number" if kind is bool else "true/false"
        default = field.get_default(call_default_factory=True)
        example = f", for example the default {as_yaml(default)}" if default is not None else ""
        raise PydanticCustomError(
            "bool_number_mixup",
            f"takes {wanted}, not {got}; give {wanted}{example or ' or null (the default)'}",
        )
