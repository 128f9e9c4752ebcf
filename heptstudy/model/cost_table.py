"""The op-group cost table (`heptstudy costs`, :mod:`heptstudy.measure.op_costs`) as the solver
plans read it: one table per model configuration, refused for another one, with the command that
makes one in every refusal."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from heptstudy.atomic import Output
from heptstudy.config import Config, keep_percent
from heptstudy.errors import HeptstudyError
from heptstudy.model.op_groups import groups_of
from heptstudy.model.solver import CostModel, GroupCost, KeepChoice, choose_keep
from heptstudy.paths import resolve_in_repo

SCHEMA = "heptstudy.op_costs/1"
COSTS_FILE = Output("heptstudy op cost table", ".json", f'"schema": "{SCHEMA}"'.encode())
KINDS = ("backbone", "decoder")
MAKE_ONE = (
    "make one for this configuration with `heptstudy costs --data-dir data/tfds --out FILE.json` "
    "(with the same --config/--set as the run) and point model.heptv2.op_costs at it"
)
#: Settings that choose a plan or where a table lies: a table measured under any of them holds.
#: The attention backend is compared as it ran (:func:`backend_in_effect`), not as spelled.
_NOT_COSTS = (
    "activation_checkpointing",
    "memory_budget_gib",
    "auto_plan_order",
    "op_costs",
    "attention_backend",
)


def backend_in_effect(config: Config, device_type: str) -> str:
    """The bucket attention a layer runs on ``device_type`` (auto: fused on CUDA, else plain;
    heptstudy.model.heptv2.HEPTv2Layer)."""
    backend = config.model.heptv2.attention_backend
    return ("fused" if device_type == "cuda" else "plain") if backend == "auto" else backend


def configuration_key(config: Config) -> dict[str, Any]:
    """What a table's costs depend on: the layers' sizes and counts, the variant and the dtype
    (every heptv2 and decoder field but the plan settings and the attention backend)."""
    model = config.model.model_dump(mode="json")
    heptv2 = {k: v for k, v in model["heptv2"].items() if k not in _NOT_COSTS}
    fields = {
        "variant": model["variant"],
        "dtype": config.train.dtype,
        "heptv2": heptv2,
        "decoder": model["decoder"],
    }
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]
    return {"digest": digest, **fields}


def layer_counts(config: Config) -> dict[str, int]:
    return {"backbone": config.model.heptv2.num_convs, "decoder": config.model.decoder.num_layers}


class CostTableError(HeptstudyError):
    """A cost table is missing, unreadable, malformed or for another model configuration."""


class CostTableMismatch(CostTableError):
    """A sound cost table, measured for another model configuration or attention path."""


def read_cost_table(config: Config) -> tuple[dict[str, Any], CostModel]:
    """The table ``model.heptv2.op_costs`` names, checked against ``config``."""
    given = config.model.heptv2.op_costs
    path = resolve_in_repo(given)
    where = f"model.heptv2.op_costs={given!r} ({path})"
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CostTableError(f"{where}: no such cost table; {MAKE_ONE}") from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        why = getattr(err, "strerror", None) or err
        raise CostTableError(
            f"{where} cannot be read as a cost table ({why}); {MAKE_ONE}"
        ) from None
    if not isinstance(table, dict) or table.get("schema") != SCHEMA:
        raise CostTableError(f"{where} is not a cost table of schema {SCHEMA}; {MAKE_ONE}")
    _check_configuration(table, configuration_key(config), where)
    _check_backend(table, config, where)
    return table, _cost_model(table, layer_counts(config), where)


def _check_configuration(table: dict[str, Any], key: dict[str, Any], where: str) -> None:
    measured = table.get("model_key")
    if measured == key:
        return
    if not isinstance(measured, dict):
        raise CostTableError(f"{where} names no model configuration (model_key); {MAKE_ONE}")
    # the digest is of the fields listed: one without the other means an edited table
    differ = _differences(measured, key) or (
        f"digest {measured.get('digest')!r} there, {key['digest']!r} here"
    )
    raise CostTableMismatch(
        f"{where} was measured for another model configuration (differing: {differ}); its "
        f"costs do not hold for this one; {MAKE_ONE}"
    )


def _check_backend(table: dict[str, Any], config: Config, where: str) -> None:
    """A table measured on one attention path holds for a configuration that runs the same one:
    ``auto`` runs the one of the device it meets, so it takes any table."""
    wanted, measured = config.model.heptv2.attention_backend, table.get("attention_backend")
    if wanted != "auto" and measured != wanted:
        raise CostTableMismatch(
            f"{where} timed the {measured} bucket attention, and model.heptv2.attention_backend "
            f"is {wanted}; {MAKE_ONE}"
        )


def _differences(measured: dict[str, Any], key: dict[str, Any], prefix: str = "") -> str:
    found = []
    for name, value in key.items():
        if name == "digest":
            continue
        other = measured.get(name)
        if isinstance(value, dict) and isinstance(other, dict):
            inner = _differences(other, value, f"{prefix}{name}.")
            found += [inner] if inner else []
        elif other != value:
            found.append(f"{prefix}{name} {other!r} there, {value!r} here")
    return ", ".join(found)


def _cost_model(table: dict[str, Any], layers: dict[str, int], where: str) -> CostModel:
    groups, rest = {}, {}
    for kind in KINDS:
        entry = (table.get("kinds") or {}).get(kind)
        if not isinstance(entry, dict):
            raise CostTableError(f"{where} has no costs of the {kind} layer; {MAKE_ONE}")
        groups[kind] = {
            g.name: GroupCost(
                _number(table, ("kinds", kind, "groups", g.name, "bytes_per_slot"), where),
                _number(table, ("kinds", kind, "groups", g.name, "seconds_per_slot"), where),
            )
            for g in groups_of(kind)
        }
        rest[kind] = _number(table, ("kinds", kind, "rest", "seconds_per_slot"), where)
    return CostModel(groups, rest, layers)


def _number(table: dict[str, Any], path: tuple[str, ...], where: str) -> float:
    value: Any = table
    for part in path:
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        found = "missing" if value is None else f"{value!r}, not a number"
        raise CostTableError(
            f"{where}: {'.'.join(path)} is {found}; the table is damaged or older than the op "
            f"groups of this code: {MAKE_ONE}"
        )
    if value < 0:
        raise CostTableError(f"{where}: {'.'.join(path)} is {value}, below 0; {MAKE_ONE}")
    return float(value)


def solved_keep(config: Config, name: str) -> KeepChoice:
    """The keep-sets of the solver plan ``name`` (``keepNN``) on ``config``'s cost table."""
    percent = keep_percent(name)
    if percent is None:
        raise HeptstudyError(f"{name!r} is not a solver plan (keepNN, NN from 0 to 100)")
    return choose_keep(read_cost_table(config)[1], percent / 100)
