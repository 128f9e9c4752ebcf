"""Checkpointing plans' names, as a configuration and a platform profile spell them."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator
from pydantic_core import PydanticCustomError

from heptstudy.config.yaml_text import as_yaml

#: The plans (:mod:`heptstudy.model.checkpoint_plan`) besides ``layersK``, ``lastK`` and ``auto``.
FIXED_PLANS = ("off", "full", "selective", "every2", "every3")
PLAN_WORDS = (
    "off, full, selective, every2, every3, layersK or lastK (the first or last K backbone "
    "layers), keepNN (every layer checkpointed, keeping what a solver chose within NN percent of the "
    "uncheckpointed activation memory, NN 0 to 100) or auto"
)
KEEP_PREFIX = "keep"


def count_plan(name: str) -> tuple[bool, int] | None:
    """``(last, K)`` of a count plan (``layersK``: first K backbone layers, ``lastK``: last K)."""
    match = re.fullmatch(r"(layers|last)(\d+)", name)
    return None if match is None else (match[1] == "last", int(match[2]))


def keep_percent(name: str) -> int | None:
    """NN of a solver plan ``keepNN`` (its budget: NN % of the uncheckpointed activation
    memory); None for another name. ``keep`` followed by anything but a whole number 0..100 is
    refused, naming what is allowed."""
    if not name.startswith(KEEP_PREFIX):
        return None
    digits = name[len(KEEP_PREFIX) :]
    if not re.fullmatch(r"[0-9]{1,3}", digits) or not 0 <= int(digits) <= 100:
        raise ValueError(
            f"{name!r}: a solver plan is keepNN with NN a whole number from 0 to 100, the percent "
            "of the uncheckpointed activation memory it may keep (e.g. keep30), not "
            f"{digits!r}"
        )
    return int(digits)


def parse_plan_name(value: Any) -> str:
    """A checkpointing plan's name as written everywhere (lower case, ``layers3``); true is
    ``full``, false (YAML's bare ``off``) ``off``. The configuration checks count plans' K."""
    if isinstance(value, bool):
        return "full" if value else "off"
    if isinstance(value, str):
        word = value.strip().lower()
        word = {"true": "full", "false": "off"}.get(word, word)
        count = count_plan(word)
        if count is not None:
            return f"{'last' if count[0] else 'layers'}{count[1]}"
        if (percent := keep_percent(word)) is not None:
            return f"{KEEP_PREFIX}{percent}"
        if word in (*FIXED_PLANS, "auto"):
            return word
    why = "; a number is not a checkpointing plan" if isinstance(value, (int, float)) else ""
    raise ValueError(f"allowed values are {PLAN_WORDS} (true/false: full/off){why}")


def _off_not_listed(value: Any) -> Any:
    if isinstance(value, list) and any(v is False or v == "off" for v in value):  # YAML: off=false
        raise PydanticCustomError(
            "plan_order",
            "lists the checkpointing plans tried after off, which is always tried first: "
            "leave off out, for example [every2, full]",
        )
    return value


def _solver_name(value: Any) -> bool:
    try:
        return isinstance(value, str) and keep_percent(value) is not None
    except ValueError:
        return False


def check_plan_order(value: list[str] | None) -> list[str] | None:
    """An ``auto_plan_order``: plan names other than off and auto, each once, at least one."""
    if value is not None and (
        not value
        or len(set(value)) != len(value)
        or not all(v in FIXED_PLANS[1:] or count_plan(v) or _solver_name(v) for v in value)
    ):
        raise PydanticCustomError(
            "plan_order",
            "takes each of selective, every2, every3, full, layersK (the first K backbone "
            "layers), lastK (the last K) and keepNN (a solver plan) at most once, at least one, "
            "cheapest first, not "
            f"{as_yaml(value)}; for example [every2, full]",
        )
    return value if value is None else [parse_plan_name(v) for v in value]


PlanOrder = Annotated[
    list[str] | None, BeforeValidator(_off_not_listed), AfterValidator(check_plan_order)
]
