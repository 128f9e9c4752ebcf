"""What a memory model is specific to, and in words why a model does not apply to a configuration.

A model holds for one device kind, dtype, model variant, attention backend and checkpointing
setting, and for the model's sizes (every field of the variant's model sections). The key keeps
those sections themselves, not only a hash of them, so that a mismatch can name the field.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from heptstudy.config import ModelConfig
from heptstudy.model.checkpoint_plan import plan_named

#: Key fields compared one by one, in the order a mismatch is explained.
SETTINGS = ("device_kind", "dtype", "variant", "attention_backend", "checkpointing")
#: Model fields that are key settings of their own, or choose auto's plan without changing the
#: memory a plan needs.
_IN_SETTINGS = (
    "attention_backend",
    "activation_checkpointing",
    "memory_budget_gib",
    "auto_plan_order",
    "op_costs",
)
#: Sections of the model configuration the other variant's network does not read.
_UNUSED_SECTIONS = {
    "hit_heptv2_grouped_tracker_features": ("track_cluster",),
    "track_cluster_mlpf": ("heptv2", "decoder", "tracker_features"),
}


def _model_sections(model: dict[str, Any]) -> dict[str, Any]:
    out = {
        k: v
        for k, v in model.items()
        if k != "variant" and k not in _UNUSED_SECTIONS.get(model.get("variant"), ())
    }
    if isinstance(out.get("heptv2"), dict):
        out["heptv2"] = {k: v for k, v in out["heptv2"].items() if k not in _IN_SETTINGS}
    return out


def model_key(config: dict[str, Any], device_kind: str) -> dict[str, Any]:
    """The key of ``config`` (a configuration as a dict) on a device of ``device_kind``."""
    model = config["model"]
    h = model.get("heptv2") or {}
    sections = _model_sections(model)
    digest = hashlib.sha256(json.dumps(sections, sort_keys=True).encode()).hexdigest()
    return {
        "device_kind": device_kind,
        "dtype": config["train"]["dtype"],
        "variant": model["variant"],
        "attention_backend": h.get("attention_backend"),
        # the plan's name ("auto" is a key of its own: its steps run different plans)
        "checkpointing": h.get("activation_checkpointing", "off"),
        "model_hash": digest[:12],
        "model": sections,
    }


def key_label(key: dict[str, Any]) -> str:
    """A short file-name-safe label: ``variant_device_dtype_backend_ckpt_hash``."""
    plan = key.get("checkpointing")
    ck = "nockpt" if plan == "off" else f"ckpt-{plan}"
    parts = [key.get(k) for k in ("variant", "device_kind", "dtype", "attention_backend")]
    return "_".join(str(p) for p in [*parts, ck, key.get("model_hash")])


def checkpointing_words(key: dict[str, Any]) -> str:
    """The label of a key's checkpointing plan (``off``, ``full``, ``every 2``, ...)."""
    layers = (key.get("model") or {}).get("heptv2", {}).get("num_convs")
    return plan_named(key.get("checkpointing"), layers).label


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def mismatches(have: dict[str, Any], want: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Why a model keyed ``have`` does not hold for a configuration keyed ``want``:
    ``(differences, assumptions)``, the latter the fields the model predates that the
    configuration leaves at their defaults (taken as equal, and said so)."""
    diffs = [
        f"{name}: model {have.get(name)!r}, configured {want.get(name)!r}"
        for name in SETTINGS
        if have.get(name) != want.get(name)
    ]
    assumed: list[str] = []
    if "model" not in have:
        if have.get("model_hash") != want.get("model_hash"):
            diffs.append("model sizes: the model records only a hash of them, and it differs")
        return diffs, assumed
    a, b = _flat(have["model"]), _flat(want.get("model", {}))
    defaults = _flat(_model_sections(ModelConfig().model_dump(mode="json")))
    for name in sorted(set(a) | set(b)):
        if name in a and name in b:
            if a[name] != b[name]:
                diffs.append(f"model.{name}: model {a[name]!r}, configured {b[name]!r}")
        elif name in b and name in defaults and b[name] == defaults[name]:
            assumed.append(f"model.{name}={b[name]!r}")
        else:
            where = "model" if name in a else "configuration"
            value = a.get(name, b.get(name))
            diffs.append(f"model.{name}={value!r} only in the {where}")
    return diffs, assumed
