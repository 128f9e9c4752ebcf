"""Will it fit? The *criterion* is the peak reserved when the model has one (what the device
must hold), else the peak allocated (a lower bound); the first failing step ends the run. A
batch's memory follows its geometry (:class:`~heptstudy.data.layout.BatchGeometry`): padded, its
longest event; packed, its total slots. :mod:`heptstudy.fitting.draws` says how random batches
of the data fall; one evaluation serves both."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from heptstudy.data.batching import padded_sizes
from heptstudy.data.layout import BatchGeometry, is_packed
from heptstudy.estimate.memory_model import MemoryModel
from heptstudy.fitting.draws import QUANTILES, draws_for
from heptstudy.units import GIB, MIB


@dataclass
class Tail:
    quantity: str  # "reserved", "reserved_expandable" or "allocated"
    events_too_long: int
    longest_fitting_padded: int | None  # longest padded event a batch may hold; None: none
    p_step_fails: float
    p_run_fails: float
    expected_failing_steps: float
    largest_safe_batch: int | None  # never fails on this data; None: not even one event
    never_fails: bool = True
    packed: bool = False  # then longest_fitting_padded is the most slots a batch may hold


@dataclass
class FitAnswer:
    per_device_batch: int
    world_size: int
    scenario_steps: int
    device_memory_gib: float
    safety_margin_gib: float
    usable_gib: float
    num_events: int
    longest_event_hits: int
    criterion: Tail
    allocated_only: Tail
    worst_batch: dict[str, Any]  # the batch holding the data set's longest event(s)
    typical_batches: list[dict[str, Any]] = field(default_factory=list)
    curve: dict[str, list] = field(default_factory=dict)  # peaks against batch longest, CDF
    packed: bool = False

    @property
    def fits(self) -> bool:
        return self.criterion.never_fails

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fits": self.fits}


def peak_mib(model: MemoryModel, quantity: str, batch_size, longest):
    """``quantity``: allocated, reserved or reserved_expandable."""
    return getattr(model, f"predict_{quantity}_mib")(batch_size, longest)


def gib(mib) -> float | None:
    """A prediction in MiB as GiB (``None``: the model does not predict that peak)."""
    return None if mib is None else float(mib) * MIB / GIB


def criterion_of(model: MemoryModel, expandable_segments: bool = False) -> str:
    if expandable_segments and model.reserved_expandable is not None:
        return "reserved_expandable"
    return "reserved" if model.reserved is not None else "allocated"


def batch_row(model, g: BatchGeometry, usable_mib: float, what: str, criterion: str):
    """One batch's predicted peaks (a packed batch is as long as its mean slots per event)."""
    length = g.slots / g.events
    worst = float(peak_mib(model, criterion, g.events, length))
    return {
        "batch": what,
        "longest_padded": None if g.packed else g.longest,
        "padded_batch_hits": g.slots,
        "allocated_gib": gib(model.predict_allocated_mib(g.events, length)),
        "reserved_gib": gib(model.predict_reserved_mib(g.events, length)),
        "reserved_expandable_gib": gib(model.predict_reserved_expandable_mib(g.events, length)),
        "margin_gib": (usable_mib - worst) * MIB / GIB,
    }


def evaluate(
    model: MemoryModel,
    lengths,
    per_device_batch: int,
    device_memory_gib: float,
    *,
    safety_margin_gib: float = 0.0,
    world_size: int = 1,
    num_steps: int = 1,
    pad_to_multiple: int = 1,
    expandable_segments: bool = False,
    batching: str = "padded",
) -> FitAnswer:
    """The answer for ``batching`` batches of ``per_device_batch`` events of ``lengths``."""
    plen = padded_sizes(lengths, pad_to_multiple)
    usable_mib = (device_memory_gib - safety_margin_gib) * GIB / MIB
    criterion = criterion_of(model, expandable_segments)
    draws = draws_for(is_packed(batching), plen, per_device_batch)

    def tail(quantity: str) -> Tail:
        def fits(b: int, length) -> np.ndarray:
            return np.asarray(peak_mib(model, quantity, b, length), dtype=float) <= usable_mib

        return Tail(
            quantity=quantity, packed=draws.packed, **draws.tail(fits, world_size, num_steps)
        )

    tails = {q: tail(q) for q in {criterion, "allocated"}}
    return FitAnswer(
        per_device_batch=per_device_batch,
        world_size=world_size,
        scenario_steps=num_steps,
        device_memory_gib=device_memory_gib,
        safety_margin_gib=safety_margin_gib,
        usable_gib=usable_mib * MIB / GIB,
        num_events=len(plen),
        longest_event_hits=int(np.max(lengths)),
        criterion=tails[criterion],
        allocated_only=tails["allocated"],
        worst_batch=batch_row(model, draws.worst, usable_mib, draws.worst_words, criterion),
        typical_batches=[
            batch_row(model, g, usable_mib, quantile_batch(q), criterion)
            for q, g in zip(QUANTILES, draws.quantiles(), strict=True)
        ],
        curve=draws.curve(model),
        packed=draws.packed,
    )


def quantile_batch(q: float) -> str:
    return "median batch" if q == 0.5 else f"p{round(q * 100)} batch"
