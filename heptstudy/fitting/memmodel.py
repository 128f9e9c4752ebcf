"""The memory model: peak memory of one training step as a function of the batch's shape.

Batches pad every event to the longest one of the batch, so every activation tensor of a step
has ``B x L`` rows (``B`` events, ``L`` the longest padded event; HEPTv2 attention is bucketed,
hence linear in ``L``; the decoder's group logits are ``B x queries x L``). The model is

    peak = fixed + per_padded_hit * (B * L) + per_event * B + per_mask_entry * (B * L^2)

The last term is the dense mask that ``flex_attention``'s ``create_block_mask`` builds eagerly
(``B x rounds x L x L`` booleans) on the fused attention path; it is zero elsewhere.

``fixed``: parameters, gradients and LAMB state (and whatever else does not depend on the batch);
``per_padded_hit``: activations per padded hit; ``per_event``: per-event tensors (queries, targets).
Fitted by non-negative least squares (each term is memory, never negative) on the counted steps of
bench reports (or on fake-device estimates), one fit per device kind, dtype, model configuration
and checkpointing policy; stored as JSON with its inputs and residuals, and validated on batch
sizes left out of the fit.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from heptstudy.atomic import atomic_write_text
from heptstudy.errors import HeptstudyError

MIB = 1024**2
GIB = 1024**3
SCHEMA = "heptstudy.memfit/1"
TERMS = ("fixed", "per_padded_hit", "per_event", "per_mask_entry")


class FitError(HeptstudyError, ValueError):
    """A memory model could not be fitted, read or applied."""


@dataclass
class Point:
    """One measured (or estimated) step: its shape and its peaks in MiB."""

    batch_size: int
    longest_padded: int
    peak_allocated_mib: float
    peak_reserved_mib: float | None = None
    source: str = ""  # report file and step, or "fake"

    @property
    def padded_batch_hits(self) -> int:
        return self.batch_size * self.longest_padded


@dataclass
class LinearFit:
    """``peak_mib = fixed + per_padded_hit * B*L + per_event * B`` for one quantity."""

    quantity: str  # "peak_allocated" or "peak_reserved"
    fixed_mib: float
    per_padded_hit_mib: float
    per_event_mib: float
    per_mask_entry_mib: float = 0.0
    rms_residual_mib: float = 0.0
    max_abs_rel_residual: float = 0.0

    def predict_mib(self, batch_size, longest_padded):
        b = np.asarray(batch_size, dtype=float)
        L = np.asarray(longest_padded, float)
        return (
            self.fixed_mib
            + self.per_padded_hit_mib * b * L
            + self.per_event_mib * b
            + self.per_mask_entry_mib * b * L**2
        )


def _design(points: list[Point]) -> np.ndarray:
    return np.array(
        [
            [1.0, p.padded_batch_hits, p.batch_size, p.batch_size * float(p.longest_padded) ** 2]
            for p in points
        ],
        dtype=float,
    )


def fit_linear(
    points: list[Point], quantity: str = "peak_allocated", quadratic: bool = False
) -> LinearFit:
    """Non-negative least squares in relative terms (each point weighs by 1/peak, so small and
    large batches count alike)."""
    from scipy.optimize import nnls

    attr = f"{quantity}_mib"
    pts = [p for p in points if getattr(p, attr) is not None]
    if len({p.padded_batch_hits for p in pts}) < 2:
        raise FitError(
            f"fitting {quantity} needs steps of at least two different padded batch sizes (B x "
            f"longest padded event); got {len(pts)} step(s): measure more batch sizes (heptstudy bench)"
        )
    A = _design(pts)
    y = np.array([getattr(p, attr) for p in pts], dtype=float)
    w = 1.0 / np.maximum(y, 1e-9)
    cols = [0, 1]
    if len({p.batch_size for p in pts}) >= 2 and len({p.longest_padded for p in pts}) >= 2:
        cols.append(2)  # else B and B*L are not separable: the per-event term folds into per-hit
    if quadratic:
        cols.append(3)
    A = A[:, cols]
    scale = A.max(axis=0)  # condition the columns
    sol, _ = nnls((A / scale) * w[:, None], y * w)
    coef = np.zeros(4)
    coef[cols] = sol / scale
    fit = LinearFit(quantity, float(coef[0]), float(coef[1]), float(coef[2]), float(coef[3]))
    res = y - fit.predict_mib([p.batch_size for p in pts], [p.longest_padded for p in pts])
    fit.rms_residual_mib = float(np.sqrt(np.mean(res**2)))
    fit.max_abs_rel_residual = float(np.max(np.abs(res / y)))
    return fit


@dataclass
class MemoryModel:
    """A fitted memory model with its provenance, inputs, residuals and validation."""

    key: dict[str, Any]
    source: str  # "measured" or "estimated"
    source_detail: str
    allocated: LinearFit
    reserved: LinearFit | None
    inputs: list[Point]
    held_out: list[Point] = field(default_factory=list)
    validation: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def predict_allocated_mib(self, batch_size, longest_padded):
        return self.allocated.predict_mib(batch_size, longest_padded)

    def predict_reserved_mib(self, batch_size, longest_padded):
        return (
            None if self.reserved is None else self.reserved.predict_mib(batch_size, longest_padded)
        )

    def residuals(self) -> list[dict[str, Any]]:
        out = []
        for kind, pts in (("fit", self.inputs), ("held_out", self.held_out)):
            for p in pts:
                pred = float(self.predict_allocated_mib(p.batch_size, p.longest_padded))
                out.append(
                    {
                        "set": kind,
                        "source": p.source,
                        "batch_size": p.batch_size,
                        "longest_padded": p.longest_padded,
                        "measured_mib": p.peak_allocated_mib,
                        "predicted_mib": pred,
                        "residual_mib": p.peak_allocated_mib - pred,
                        "rel_error": (pred - p.peak_allocated_mib) / p.peak_allocated_mib,
                    }
                )
        return out

    def describe(self) -> str:
        k = self.key
        return (
            f"{self.source} memory model for {k.get('variant')} ({k.get('device_kind')}, {k.get('dtype')}, "
            f"attention {k.get('attention_backend')}, checkpointing {k.get('checkpointing')}): "
            f"{self.allocated.fixed_mib:,.0f} MiB fixed + {self.allocated.per_padded_hit_mib * 1024:,.2f} KiB "
            f"per padded hit + {self.allocated.per_event_mib:,.2f} MiB per event"
            + (
                f" + {self.allocated.per_mask_entry_mib * MIB:,.3f} B per attention-mask entry (B x L^2)"
                if self.allocated.per_mask_entry_mib
                else ""
            )
            + f"; {self.source_detail}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "key": self.key,
            "source": self.source,
            "source_detail": self.source_detail,
            "model": "peak_mib = fixed_mib + per_padded_hit_mib * (batch_size * longest_padded) + per_event_mib * batch_size"
            " + per_mask_entry_mib * batch_size * longest_padded**2",
            "allocated": asdict(self.allocated),
            "reserved": asdict(self.reserved) if self.reserved else None,
            "inputs": [asdict(p) for p in self.inputs],
            "held_out": [asdict(p) for p in self.held_out],
            "residuals": self.residuals(),
            "validation": self.validation,
            "notes": self.notes,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "memory model") -> MemoryModel:
        if d.get("schema") != SCHEMA:
            raise FitError(
                f"{where}: schema {d.get('schema')!r} is not {SCHEMA!r}; refit it (heptstudy fit)"
            )
        try:
            return cls(
                key=d["key"],
                source=d["source"],
                source_detail=d["source_detail"],
                allocated=LinearFit(**d["allocated"]),
                reserved=LinearFit(**d["reserved"]) if d.get("reserved") else None,
                inputs=[Point(**p) for p in d["inputs"]],
                held_out=[Point(**p) for p in d.get("held_out", [])],
                validation=d.get("validation", {}),
                notes=d.get("notes", []),
            )
        except (KeyError, TypeError) as err:
            raise FitError(f"{where}: missing or unexpected field ({err}); refit it") from None

    def save(self, path: str | Path) -> Path:
        return atomic_write_text(path, json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> MemoryModel:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()), str(path))
        except (OSError, json.JSONDecodeError) as err:
            raise FitError(f"cannot read memory model {path}: {err}") from None


# ------------------------------------------------------------------------------- keys


def model_key(config: dict[str, Any], device_kind: str) -> dict[str, Any]:
    """What a memory model is specific to: device kind, dtype, attention path, variant,
    checkpointing and a hash of the whole model section (sizes, layers, queries)."""
    model = config["model"]
    h = model.get("heptv2", {})
    digest = hashlib.sha256(json.dumps(model, sort_keys=True).encode()).hexdigest()[:12]
    return {
        "device_kind": device_kind,
        "dtype": config["train"]["dtype"],
        "attention_backend": h.get("attention_backend"),
        "variant": model["variant"],
        "checkpointing": bool(h.get("activation_checkpointing")),
        "checkpointing_policy": h.get("activation_checkpointing_policy")
        if h.get("activation_checkpointing")
        else None,
        "model_hash": digest,
    }


def key_label(key: dict[str, Any]) -> str:
    ck = "ckpt" if key["checkpointing"] else "nockpt"
    return f"{key['variant']}_{key['device_kind']}_{key['dtype']}_{key['attention_backend']}_{ck}_{key['model_hash']}"


# ------------------------------------------------------------------------------- from reports


def points_from_reports(paths) -> dict[str, tuple[dict[str, Any], list[Point]]]:
    """Counted steps of ``kind="memory"``, ``status="ok"`` bench reports, grouped by
    :func:`model_key` (label -> (key, points))."""
    from heptstudy.measure.report import read_report

    groups: dict[str, tuple[dict[str, Any], list[Point]]] = {}
    for path in paths:
        rep = read_report(path)
        if rep.kind != "memory" or rep.status != "ok":
            continue
        key = model_key(rep.config, rep.environment.device_kind)
        label = key_label(key)
        pts = groups.setdefault(label, (key, []))[1]
        for s in rep.steps:
            if s.counted and s.peak_allocated_mib is not None:
                pts.append(
                    Point(
                        batch_size=len(s.padded_hits),
                        longest_padded=max(s.padded_hits),
                        peak_allocated_mib=s.peak_allocated_mib,
                        peak_reserved_mib=s.peak_reserved_mib,
                        source=f"{Path(path).name}#step{s.step}",
                    )
                )
    return groups


def fit_points(
    key: dict[str, Any],
    points: list[Point],
    held_out_batch_sizes=(),
    source="measured",
    source_detail="",
) -> MemoryModel:
    """Fit on the points whose batch size is not in ``held_out_batch_sizes``; validate on the rest."""
    held = set(int(b) for b in held_out_batch_sizes)
    train = [p for p in points if p.batch_size not in held]
    test = [p for p in points if p.batch_size in held]
    quad = key.get("attention_backend") == "fused"
    alloc = fit_linear(train, "peak_allocated", quad)
    reserved = None
    if sum(p.peak_reserved_mib is not None for p in train) >= 2:
        try:
            reserved = fit_linear(train, "peak_reserved", quad)
        except FitError:
            reserved = None
    mm = MemoryModel(
        key=key,
        source=source,
        source_detail=source_detail,
        allocated=alloc,
        reserved=reserved,
        inputs=train,
        held_out=test,
    )
    errs = [r["rel_error"] for r in mm.residuals() if r["set"] == "held_out"]
    mm.validation = {
        "held_out_batch_sizes": sorted(held),
        "fit_batch_sizes": sorted({p.batch_size for p in train}),
        "held_out_points": len(test),
        "max_abs_rel_error": float(max(map(abs, errs))) if errs else None,
        "mean_rel_error": float(np.mean(errs)) if errs else None,
        "fit_max_abs_rel_residual": alloc.max_abs_rel_residual,
    }
    return mm


def fit_reports(paths, held_out_batch_sizes=()) -> list[MemoryModel]:
    """One measured memory model per group of reports (see :func:`points_from_reports`)."""
    paths = [Path(p) for p in paths]
    out = []
    for _label, (key, pts) in points_from_reports(paths).items():
        sizes = sorted({p.batch_size for p in pts})
        detail = f"bench reports {', '.join(sorted({p.source.split('#')[0] for p in pts}))} (batch sizes {sizes})"
        out.append(fit_points(key, pts, held_out_batch_sizes, "measured", detail))
    if not out:
        raise FitError(
            f"no successful memory reports among {[str(p) for p in paths]}; run heptstudy bench first"
        )
    return out


def expand_report_paths(paths) -> list[Path]:
    """Files as given; directories as their ``*.json`` files."""
    out: list[Path] = []
    for p in map(Path, paths):
        out += sorted(p.glob("*.json")) if p.is_dir() else [p]
    return out
