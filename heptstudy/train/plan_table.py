"""Whether a solver plan's cost table holds on the device a run meets: the table prices the
attention it timed, and ``attention_backend: auto`` runs the fused one on CUDA, whose attention no
op group keeps, so a table timed on the plain path would keep there what the layer recomputes."""

from __future__ import annotations

from collections.abc import Iterable

from heptstudy.config import Config
from heptstudy.model.checkpoint_plan import CheckpointPlan
from heptstudy.model.cost_table import (
    MAKE_ONE,
    CostTableMismatch,
    backend_in_effect,
    read_cost_table,
)


def _mismatch(config: Config, device_type: str) -> tuple[str, str] | None:
    """(why ``config``'s cost table does not hold on ``device_type``, the attention it timed),
    or None where it holds."""
    measured = read_cost_table(config)[0].get("attention_backend")
    runs = backend_in_effect(config, device_type)
    if measured == runs:
        return None
    why = (
        f"model.heptv2.op_costs={config.model.heptv2.op_costs!r} timed the {measured} bucket "
        f"attention, and on {device_type} this configuration runs the {runs} one "
        f"(model.heptv2.attention_backend={config.model.heptv2.attention_backend})"
    )
    return why, measured


def attention_mismatch(config: Config, device_type: str) -> str | None:
    """Why ``config``'s cost table does not hold on ``device_type``, or None."""
    found = _mismatch(config, device_type)
    return found and found[0]


def check_table_on(config: Config, plans: Iterable[CheckpointPlan], device_type: str) -> None:
    """Refuse solver plans among ``plans`` whose table does not hold on ``device_type``."""
    if any(p.kind_keep for p in plans) and (found := _mismatch(config, device_type)):
        why, measured = found
        raise CostTableMismatch(
            f"{why}; set model.heptv2.attention_backend={measured} (a platform profile does), "
            f"or {MAKE_ONE}"
        )


def plans_held_on(
    config: Config, plans: list[CheckpointPlan], device_type: str
) -> tuple[list[CheckpointPlan], str]:
    """``auto``'s ``plans`` without the solver plans whose table does not hold on
    ``device_type``, and what to add to the order's source (why, or nothing)."""
    if not any(p.kind_keep for p in plans) or not (why := attention_mismatch(config, device_type)):
        return plans, ""
    return [p for p in plans if not p.kind_keep], f"; no solver plan, as {why}"
