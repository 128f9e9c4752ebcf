"""The base of every schema of user input: unlike plain pydantic, a number key refuses
true/false, a true/false key refuses numbers and a whole-number key refuses 1.5, inf and 1e30."""

from __future__ import annotations

from contextlib import suppress
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic.fields import FieldInfo
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


#: Whole numbers a float holds exactly; past it 1e30 is 1000000000000000019884624838656, not the
#: number written, so a float is read as a whole number only up to here.
_EXACT = 2**53
_BEYOND_EXACT = (
    " (with a decimal point or an exponent a number is exact only up to 2**53; write a larger "
    "one out in digits)"
)


def _inexact_whole(value: Any) -> float | None:
    """The first float in ``value`` that is no exact whole number: a fraction, inf or nan, or
    beyond :data:`_EXACT`; pydantic would round the last to a whole number nobody wrote."""
    for item in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(item, float) and not (item.is_integer() and abs(item) <= _EXACT):
            return item
    return None


class StrictInput(BaseModel):
    """The schema of user input (configuration, measurement request); a string given for a
    number or true/false is read as a ``--set KEY=VALUE``'s VALUE is."""

    # NaN and the infinities refused: none is meant, and reports record configurations as JSON
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_as_meant(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode turns true into 1 and 1 into true: a typo, never an intention
        field = cls.model_fields.get(info.field_name or "")
        kind = _scalar_kind(field.annotation) if field else None
        if kind is None:
            return value
        if isinstance(value, str):  # as the VALUE of KEY=VALUE; unreadable text stays
            with suppress(ConfigError):
                value = parse_overrides([f"value={value}"])["value"]
        if _bool_mixup(kind, value):
            wanted = (
                "true or false" if kind is bool else f"{'a whole' if kind is int else 'a'} number"
            )
            got = "a number" if kind is bool else "true/false"
            raise PydanticCustomError(
                "bool_number_mixup", f"takes {wanted}, not {got}; {_give(field, wanted)}"
            )
        if kind is int and (inexact := _inexact_whole(value)) is not None:
            why = _BEYOND_EXACT if inexact.is_integer() else ""
            raise PydanticCustomError(
                "inexact_whole_number",
                f"takes a whole number, not {as_yaml(inexact)}{why}; "
                f"{_give(field, 'a whole number')}",
            )
        return value


def _give(field: FieldInfo, wanted: str) -> str:
    if field.is_required():  # no default to show (a platform profile's device, say)
        return f"give {wanted}"
    default = field.get_default(call_default_factory=True)
    example = f", for example the default {as_yaml(default)}" if default is not None else ""
    return f"give {wanted}{example or ' or null (the default)'}"


def named_folder(value: str, empty_means: str, default: str) -> str:
    """A folder path that names a folder: an empty one would be read as ``empty_means`` (the
    working directory, the repository), a place nobody asked for, so it is refused."""
    if not value.strip():
        raise ValueError(
            f"an empty or blank path would be read as {empty_means}; give the folder by name, "
            f"for example the default {default!r}"
        )
    return value
