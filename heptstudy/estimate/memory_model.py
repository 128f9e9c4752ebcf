"""The memory model: peak memory of one training step as a function of the batch's shape.

Batches pad every event to the longest one (``L``), so activations have ``B x L`` rows. The
``B x L^2`` term (fused path only) is the dense mask a block mask may build; the fit is
non-negative (each term is memory). Peak *reserved* is allocated times a fitted ratio, which
depends on the order of allocation sizes a run meets: hence leave-one-batch-size-out validation.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from heptstudy.atomic import Output, atomic_write_text, json_text
from heptstudy.errors import HeptstudyError
from heptstudy.estimate.keys import key_label
from heptstudy.units import MIB

SCHEMA = "heptstudy.memfit/3"
#: /2 lacks the expandable-segments reserved and the fingerprint (refused by fitting.select).
READABLE_SCHEMAS = ("heptstudy.memfit/2", SCHEMA)
#: ``fit --save-model`` replaces only a memory model (of any schema).
MODEL_FILE = Output("heptstudy memory model", ".json", b'"schema": "heptstudy.memfit/')


class FitError(HeptstudyError, ValueError):
    """A memory model could not be fitted, read, chosen or applied."""


@dataclass
class Point:
    """One measured (or estimated) step: its shape and one peak in MiB."""

    batch_size: int
    longest_padded: int
    peak_mib: float
    source: str = ""  # report file and step, or "fake cpu step"

    @property
    def padded_batch_hits(self) -> int:
        return self.batch_size * self.longest_padded


@dataclass
class LinearFit:
    fixed_mib: float
    per_padded_hit_mib: float
    per_event_mib: float
    per_mask_entry_mib: float = 0.0
    rms_residual_mib: float = 0.0
    max_abs_rel_residual: float = 0.0

    def predict_mib(self, batch_size, longest_padded):
        b = np.asarray(batch_size, dtype=float)
        length = np.asarray(longest_padded, dtype=float)
        return (
            self.fixed_mib
            + self.per_padded_hit_mib * b * length
            + self.per_event_mib * b
            + self.per_mask_entry_mib * b * length**2
        )


@dataclass
class ReservedFit:
    ratio: float
    rms_residual_mib: float = 0.0
    max_abs_rel_residual: float = 0.0


def _residual_stats(points: list[Point], predicted) -> tuple[float, float]:
    y = np.array([p.peak_mib for p in points], dtype=float)
    res = y - np.asarray(predicted, dtype=float)
    return float(np.sqrt(np.mean(res**2))), float(np.max(np.abs(res / y)))


def fit_allocated(points: list[Point], quadratic: bool = False) -> LinearFit:
    """Non-negative least squares, each point weighted by 1/peak."""
    from scipy.optimize import nnls

    if len({p.padded_batch_hits for p in points}) < 2:
        raise FitError(
            f"fitting peak allocated needs steps of at least two different padded batch sizes "
            f"(B x longest padded event); got {len(points)} step(s) of "
            f"{sorted({p.padded_batch_hits for p in points})}: measure more batch sizes "
            "(heptstudy bench)"
        )
    design = np.array(
        [
            [1.0, p.padded_batch_hits, p.batch_size, p.batch_size * p.longest_padded**2]
            for p in points
        ],
        dtype=float,
    )
    y = np.array([p.peak_mib for p in points], dtype=float)
    cols = [0, 1]
    if len({p.batch_size for p in points}) >= 2 and len({p.longest_padded for p in points}) >= 2:
        cols.append(2)  # else B and B*L are not separable: the per-event term folds into per-hit
    if quadratic:
        cols.append(3)
    a = design[:, cols]
    scale = a.max(axis=0)  # condition the columns
    w = 1.0 / np.maximum(y, 1e-9)
    sol, _ = nnls((a / scale) * w[:, None], y * w)
    coef = np.zeros(4)
    coef[cols] = sol / scale
    fit = LinearFit(*map(float, coef))
    fit.rms_residual_mib, fit.max_abs_rel_residual = _residual_stats(
        points, fit.predict_mib([p.batch_size for p in points], [p.longest_padded for p in points])
    )
    return fit


def fit_reserved(points: list[Point], allocated: LinearFit) -> ReservedFit:
    """The ratio minimising the squared relative error of ``ratio x allocated`` over ``points``."""
    if not points:
        raise FitError("fitting peak reserved needs at least one step with a reserved peak")
    a = allocated.predict_mib([p.batch_size for p in points], [p.longest_padded for p in points])
    q = np.asarray(a, dtype=float) / np.array([p.peak_mib for p in points], dtype=float)
    ratio = float(q.sum() / (q**2).sum())
    fit = ReservedFit(ratio)
    fit.rms_residual_mib, fit.max_abs_rel_residual = _residual_stats(points, ratio * a)
    return fit


def _leave_one_batch_size_out(
    alloc: list[Point], reserved: list[Point], quadratic: bool, expandable: list[Point] = ()
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    quantities = [("allocated", alloc), ("reserved", reserved)]
    if expandable:
        quantities.append(("reserved_expandable", expandable))
    for quantity, pts in quantities:
        rows = []
        sizes = sorted({p.batch_size for p in pts})
        for b in sizes if len(sizes) >= 2 else []:
            train = [p for p in alloc if p.batch_size != b]
            test = [p for p in pts if p.batch_size == b]
            try:
                fit = fit_allocated(train, quadratic)
                pred = fit.predict_mib(
                    [p.batch_size for p in test], [p.longest_padded for p in test]
                )
                if quantity != "allocated":
                    pred = fit_reserved([p for p in pts if p.batch_size != b], fit).ratio * pred
            except FitError:
                continue  # the other batch sizes alone do not determine a fit
            err = (np.asarray(pred) - [p.peak_mib for p in test]) / [p.peak_mib for p in test]
            rows.append(
                {
                    "held_out_batch_size": b,
                    "fit_batch_sizes": [s for s in sizes if s != b],
                    "held_out_steps": len(test),
                    "mean_rel_error": float(np.mean(err)),
                    "max_abs_rel_error": float(np.max(np.abs(err))),
                }
            )
        out[quantity] = {
            "method": "leave one batch size out",
            "rows": rows,
            "max_abs_rel_error": max((r["max_abs_rel_error"] for r in rows), default=None),
        }
        if not rows:
            out[quantity]["why"] = (
                f"measured at batch sizes {sizes}: no batch size can be left out with a fit "
                "still possible on the others (needs two padded batch sizes)"
            )
    return out


@dataclass
class MemoryModel:
    """A fitted memory model with its provenance, inputs, residuals and validation."""

    key: dict[str, Any]
    source: str  # "measured" or "estimated"
    source_detail: str
    allocated: LinearFit
    reserved: ReservedFit | None
    allocated_points: list[Point]
    reserved_points: list[Point] = field(default_factory=list)
    #: estimated GPU models: reserved with the allocator's expandable segments (never measured)
    reserved_expandable: ReservedFit | None = None
    reserved_expandable_points: list[Point] = field(default_factory=list)
    validation: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    fingerprint: dict[str, Any] | None = None

    def predict_allocated_mib(self, batch_size, longest_padded):
        return self.allocated.predict_mib(batch_size, longest_padded)

    def predict_reserved_mib(self, batch_size, longest_padded):
        if self.reserved is None:
            return None
        return self.reserved.ratio * self.allocated.predict_mib(batch_size, longest_padded)

    def predict_reserved_expandable_mib(self, batch_size, longest_padded):
        if self.reserved_expandable is None:
            return None
        return self.reserved_expandable.ratio * self.allocated.predict_mib(
            batch_size, longest_padded
        )

    def _out_of_range(self) -> list[str]:
        d = asdict(self)
        numbers = [(f"allocated.{k}", v, 0) for k, v in d["allocated"].items()]
        for name in ("reserved", "reserved_expandable"):
            numbers += [(f"{name}.{k}", v, int(k == "ratio")) for k, v in (d[name] or {}).items()]
        for name in ("allocated_points", "reserved_points", "reserved_expandable_points"):
            for i, p in enumerate(d[name]):
                numbers += [
                    (f"{name}[{i}].{k}", p[k], int(k != "peak_mib"))
                    for k in ("batch_size", "longest_padded", "peak_mib")
                ]
        return [
            f"{field_name}={value!r} is not allowed (a finite number >= {low}"
            + (": reserved is never below allocated)" if field_name.endswith("ratio") else ")")
            for field_name, value, low in numbers
            if isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < low
        ]

    def held_out_error(self, quantity: str) -> float | None:
        """Largest relative error on a held-out batch size (``None``: not validated)."""
        return (self.validation.get(quantity) or {}).get("max_abs_rel_error")

    def describe(self) -> str:
        a, k = self.allocated, self.key
        text = (
            f"{self.source} memory model for {k.get('variant')} ({k.get('device_kind')}, "
            f"{k.get('dtype')}, attention {k.get('attention_backend')}, checkpointing "
            f"{k.get('checkpointing')}): "
            f"allocated {a.fixed_mib:,.0f} MiB fixed + {a.per_padded_hit_mib * 1024:,.2f} KiB per "
            f"padded hit + {a.per_event_mib:,.2f} MiB per event"
        )
        if a.per_mask_entry_mib:
            text += f" + {a.per_mask_entry_mib * MIB:,.3f} B per attention-mask entry (B x L^2)"
        if self.reserved is not None:
            text += f"; reserved {self.reserved.ratio:.3f} x allocated"
        if self.reserved_expandable is not None:
            text += (
                f" ({self.reserved_expandable.ratio:.3f} x with expandable segments, simulated, "
                "never measured)"
            )
        return text + f"; {self.source_detail}"

    def to_dict(self) -> dict[str, Any]:
        # the fields after "model" in their dataclass order
        d = asdict(self)
        return {
            "schema": SCHEMA,
            "label": key_label(self.key),
            "key": d.pop("key"),
            "source": d.pop("source"),
            "source_detail": d.pop("source_detail"),
            "provenance": d.pop("provenance"),
            "model": (
                "peak_allocated_mib = fixed_mib + per_padded_hit_mib * batch_size * longest_padded"
                " + per_event_mib * batch_size + per_mask_entry_mib * batch_size * "
                "longest_padded**2; peak_reserved_mib = ratio * peak_allocated_mib (also "
                "reserved_expandable: the ratio with expandable segments)"
            ),
            **d,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "memory model") -> MemoryModel:
        if d.get("schema") not in READABLE_SCHEMAS:
            raise FitError(
                f"{where}: schema {d.get('schema')!r} is not {SCHEMA!r}; refit it from its reports "
                "(heptstudy fit --reports DIR --save-model PATH)"
            )
        args = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        try:
            if "allocated" in d:
                args["allocated"] = LinearFit(**d["allocated"])
            for name in ("reserved", "reserved_expandable"):
                args[name] = ReservedFit(**d[name]) if d.get(name) else None
            for name in ("allocated_points", "reserved_points", "reserved_expandable_points"):
                if name in d:
                    args[name] = [Point(**p) for p in d[name]]
            model = cls(**args)
        except (KeyError, TypeError) as err:
            raise FitError(f"{where}: missing or unexpected field ({err}); refit it") from None
        bad = model._out_of_range()
        if bad:
            raise FitError(
                f"memory model {where}: {'; '.join(bad)}; the file is damaged or was edited: "
                "regenerate it with scripts/regenerate_fits.sh (configs/fit/README.md)"
            )
        return model

    def save(self, path: str | Path) -> Path:
        text = json_text(self.to_dict(), f"the memory model {path}")
        return atomic_write_text(path, text, kind=MODEL_FILE)

    @classmethod
    def load(cls, path: str | Path) -> MemoryModel:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise FitError(f"cannot read memory model {path}: {err}") from None
        if not isinstance(data, dict):
            raise FitError(f"memory model {path}: not a JSON object; refit it")
        return cls.from_dict(data, str(path))


def fit_points(
    key: dict[str, Any],
    allocated: list[Point],
    reserved: list[Point] = (),
    *,
    source: str = "measured",
    source_detail: str = "",
    provenance: dict[str, Any] | None = None,
    reserved_expandable: list[Point] = (),
    fingerprint: dict[str, Any] | None = None,
) -> MemoryModel:
    """Fit on every point and validate by leaving one batch size out."""
    quadratic = key.get("attention_backend") == "fused"
    alloc = fit_allocated(list(allocated), quadratic)
    res = fit_reserved(list(reserved), alloc) if reserved else None
    expandable = fit_reserved(list(reserved_expandable), alloc) if reserved_expandable else None
    return MemoryModel(
        key=key,
        source=source,
        source_detail=source_detail,
        allocated=alloc,
        reserved=res,
        allocated_points=list(allocated),
        reserved_points=list(reserved),
        validation=_leave_one_batch_size_out(
            list(allocated), list(reserved), quadratic, list(reserved_expandable)
        ),
        provenance=dict(provenance or {}),
        reserved_expandable=expandable,
        reserved_expandable_points=list(reserved_expandable),
        fingerprint=fingerprint,
    )
