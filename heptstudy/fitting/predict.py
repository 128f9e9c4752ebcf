"""Will it fit? The *criterion* is the peak reserved when the model has one (what the device
must hold), else the peak allocated (a lower bound); the first failing step ends the run. A
padded batch's memory follows its longest event; a packed batch's its total slots (each event
rounded up alone): its tail is the sum of ``B`` random events' slots, its worst the B longest."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from heptstudy.data.batching import padded_sizes
from heptstudy.estimate.memory_model import MemoryModel
from heptstudy.fitting import occupancy
from heptstudy.units import GIB, MIB

QUANTILES = (0.5, 0.9, 0.99)
MAX_BATCH = 4096
#: Random batches (seeded) drawn for the quantiles and tail of a packed batch's slots.
SAMPLED_BATCHES = 20_000


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
    batching: str = "padded"  # packed: longest_fitting_padded is the most slots a batch may hold


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

    batching: str = "padded"

    @property
    def fits(self) -> bool:
        return self.criterion.never_fails

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fits": self.fits}


def peak_mib(model: MemoryModel, quantity: str, batch_size, longest):
    if quantity == "reserved":
        return model.predict_reserved_mib(batch_size, longest)
    if quantity == "reserved_expandable":
        return model.predict_reserved_expandable_mib(batch_size, longest)
    return model.predict_allocated_mib(batch_size, longest)


def gib(mib) -> float | None:
    """A prediction in MiB as GiB (``None``: the model does not predict that peak)."""
    return None if mib is None else float(mib) * MIB / GIB


def criterion_of(model: MemoryModel, expandable_segments: bool = False) -> str:
    if expandable_segments and model.reserved_expandable is not None:
        return "reserved_expandable"
    return "reserved" if model.reserved is not None else "allocated"


def largest_safe_batch(
    model: MemoryModel, quantity: str, longest_padded: int, usable_mib: float
) -> int | None:
    """Largest batch fitting the data's longest padded event; ``None``: one event does not."""

    def ok(b: int) -> bool:
        return float(peak_mib(model, quantity, b, longest_padded)) <= usable_mib

    if not ok(1):
        return None
    if ok(MAX_BATCH):
        return MAX_BATCH
    lo, hi = 1, MAX_BATCH  # ok(lo), not ok(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def quantile_batch(q: float) -> str:
    return "median batch" if q == 0.5 else f"p{round(q * 100)} batch"


def batch_row(model, batch: int, longest, usable_mib: float, what: str, criterion: str, slots=None):
    """One batch's predicted peaks; a packed batch (``slots``) is as long as its mean slots."""
    worst = float(peak_mib(model, criterion, batch, longest))
    return {
        "batch": what,
        "longest_padded": None if slots is not None else int(longest),
        "padded_batch_hits": int(slots) if slots is not None else int(longest) * batch,
        "allocated_gib": gib(model.predict_allocated_mib(batch, longest)),
        "reserved_gib": gib(model.predict_reserved_mib(batch, longest)),
        "reserved_expandable_gib": gib(model.predict_reserved_expandable_mib(batch, longest)),
        "margin_gib": (usable_mib - worst) * MIB / GIB,
    }


def _padded_tail(model, quantity, plen, batch, world_size, num_steps, usable_mib) -> Tail:
    peaks = np.asarray(peak_mib(model, quantity, batch, plen), dtype=float)
    bad = int((peaks > usable_mib).sum())
    fitting = plen[peaks <= usable_mib]
    p_step = occupancy.p_step_fails(len(plen), bad, batch, world_size)
    return Tail(
        quantity=quantity,
        events_too_long=bad,
        longest_fitting_padded=int(fitting.max()) if len(fitting) else None,
        p_step_fails=p_step,
        p_run_fails=occupancy.p_run_fails(len(plen), bad, batch, world_size, num_steps),
        expected_failing_steps=p_step * num_steps,
        largest_safe_batch=largest_safe_batch(model, quantity, int(plen.max()), usable_mib),
        never_fails=bad == 0,
    )


def _padded(model, plen, batch, world_size, num_steps, usable_mib, criterion):
    """``(tails, typical batches, worst batch, curve)`` of padded batches."""
    tails = {
        q: _padded_tail(model, q, plen, batch, world_size, num_steps, usable_mib)
        for q in {criterion, "allocated"}
    }
    levels = np.unique(plen)
    cdf = occupancy.batch_longest_cdf(plen, batch, levels)
    reserved = model.predict_reserved_mib(batch, levels)
    # the smallest padded length L with P(batch longest <= L) >= q
    at = np.minimum(np.searchsorted(cdf, np.array(QUANTILES) - 1e-12), len(levels) - 1)
    longest = dict(zip(QUANTILES, levels[at].astype(int).tolist(), strict=True))
    typical = [
        batch_row(model, batch, longest[q], usable_mib, quantile_batch(q), criterion)
        for q in QUANTILES
    ]
    worst = batch_row(
        model, batch, int(plen.max()), usable_mib, "holding the longest event", criterion
    )
    curve = {
        "longest_padded": levels.tolist(),
        "p_batch_longest_at_most": cdf.tolist(),
        "allocated_gib": (model.predict_allocated_mib(batch, levels) / 1024).tolist(),
        "reserved_gib": None if reserved is None else (np.asarray(reserved) / 1024).tolist(),
    }
    return tails, typical, worst, curve


def _packed_peak(model, quantity, batch: int, slots):
    """The memory models' per-event length of a packed batch is its mean slots per event."""
    return np.asarray(peak_mib(model, quantity, batch, np.asarray(slots) / batch), dtype=float)


def sampled_batch_slots(plen: np.ndarray, batch: int, seed: int = 0) -> np.ndarray:
    """Slots of ``SAMPLED_BATCHES`` uniformly random batches of ``batch`` distinct events."""
    rng = np.random.default_rng(seed)
    if batch >= len(plen):
        return np.full(1, plen.sum())
    return np.array(
        [plen[rng.choice(len(plen), batch, replace=False)].sum() for _ in range(SAMPLED_BATCHES)]
    )


def _most_slots(model, quantity, batch: int, usable_mib: float, hi: int) -> int | None:
    """The most slots a batch of ``batch`` events may hold within ``usable_mib``."""
    if _packed_peak(model, quantity, batch, batch) > usable_mib:
        return None
    while _packed_peak(model, quantity, batch, hi) <= usable_mib:
        hi *= 2
    lo = batch
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok = _packed_peak(model, quantity, batch, mid) <= usable_mib
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo


def _packed_tail(model, quantity, plen, sampled, batch, world_size, num_steps, usable_mib):
    most = _most_slots(model, quantity, batch, usable_mib, int(plen.sum()))
    desc = np.sort(plen)[::-1]
    top = np.cumsum(desc)
    safe = [b for b in range(1, min(len(top), MAX_BATCH) + 1)
            if _packed_peak(model, quantity, b, top[b - 1]) <= usable_mib]  # fmt: skip
    p_batch = 1.0 if most is None else float((sampled > most).mean())
    p_step = 1.0 - (1.0 - p_batch) ** world_size
    return Tail(
        quantity=quantity,
        events_too_long=0 if most is not None else len(plen),
        longest_fitting_padded=most,
        p_step_fails=p_step,
        p_run_fails=1.0 - (1.0 - p_step) ** num_steps,
        expected_failing_steps=p_step * num_steps,
        largest_safe_batch=max(safe) if safe else None,
        never_fails=most is not None and desc[:batch].sum() <= most,
        batching="packed",
    )


def _packed(model, plen, batch, world_size, num_steps, usable_mib, criterion):
    """``(tails, typical batches, worst batch, curve)`` of packed batches."""
    sampled = sampled_batch_slots(plen, batch)
    tails = {
        q: _packed_tail(model, q, plen, sampled, batch, world_size, num_steps, usable_mib)
        for q in {criterion, "allocated"}
    }

    def row(slots: int, what: str):
        return batch_row(model, batch, slots / batch, usable_mib, what, criterion, slots=slots)

    typical = [
        row(int(np.quantile(sampled, q, method="higher")), quantile_batch(q)) for q in QUANTILES
    ]
    worst = row(int(np.sort(plen)[::-1][:batch].sum()), "holding the longest events")
    levels = np.unique(sampled)
    cdf = np.searchsorted(np.sort(sampled), levels, side="right") / len(sampled)
    return (
        tails,
        typical,
        worst,
        {"batch_slots": levels.tolist(), "p_batch_slots_at_most": cdf.tolist()},
    )


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
    """The answer for ``padded`` or ``packed`` batches of ``per_device_batch`` events."""
    plen = padded_sizes(lengths, pad_to_multiple)
    usable_mib = (device_memory_gib - safety_margin_gib) * GIB / MIB
    criterion = criterion_of(model, expandable_segments)
    tails, typical, worst, curve = (_packed if batching == "packed" else _padded)(
        model, plen, per_device_batch, world_size, num_steps, usable_mib, criterion
    )
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
        worst_batch=worst,
        typical_batches=typical,
        curve=curve,
        batching=batching,
    )
