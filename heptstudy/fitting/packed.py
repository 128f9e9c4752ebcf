"""Will it fit, for packed batches: a batch's memory follows its slots in all (every event
rounded up on its own), so the tail is that of the sum of ``B`` random events' slots, not of the
batch's longest event. The worst batch holds the ``B`` longest events of the data."""

from __future__ import annotations

import numpy as np

from heptstudy.estimate.memory_model import MemoryModel
from heptstudy.fitting.predict import (
    MAX_BATCH,
    QUANTILES,
    FitAnswer,
    Tail,
    batch_row,
    budget,
    peak_mib,
    quantile_batch,
)
from heptstudy.units import GIB, MIB

#: Random batches drawn to find the quantiles and tail of a batch's slots (seeded: the answer
#: is the same on every run).
SAMPLED_BATCHES = 20_000


def _peak(model, quantity, batch: int, slots):
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
    if _peak(model, quantity, batch, batch) > usable_mib:
        return None
    while _peak(model, quantity, batch, hi) <= usable_mib:
        hi *= 2
    lo = batch
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _peak(model, quantity, batch, mid) <= usable_mib else (lo, mid)
    return lo


def _largest_safe(model, quantity, plen_desc: np.ndarray, usable_mib: float) -> int | None:
    top = np.cumsum(plen_desc)
    ok = [b for b in range(1, min(len(top), MAX_BATCH) + 1)
          if _peak(model, quantity, b, top[b - 1]) <= usable_mib]  # fmt: skip
    return max(ok) if ok else None


def _tail(model, quantity, plen, sampled, batch, world_size, num_steps, usable_mib) -> Tail:
    most = _most_slots(model, quantity, batch, usable_mib, int(plen.sum()))
    worst = np.sort(plen)[::-1][:batch].sum()
    p_batch = 1.0 if most is None else float((sampled > most).mean())
    p_step = 1.0 - (1.0 - p_batch) ** world_size
    return Tail(
        quantity=quantity,
        events_too_long=0 if most is not None else len(plen),
        longest_fitting_padded=most,
        p_step_fails=p_step,
        p_run_fails=1.0 - (1.0 - p_step) ** num_steps,
        expected_failing_steps=p_step * num_steps,
        largest_safe_batch=_largest_safe(model, quantity, np.sort(plen)[::-1], usable_mib),
        never_fails=most is not None and worst <= most,
        batching="packed",
    )


def _row(model, batch: int, slots: int, usable_mib: float, what: str, criterion: str):
    return batch_row(model, batch, slots / batch, usable_mib, what, criterion, slots=slots)


def evaluate_packed(
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
) -> FitAnswer:
    plen, usable_mib, criterion = budget(
        model, lengths, pad_to_multiple, device_memory_gib, safety_margin_gib, expandable_segments
    )
    sampled = sampled_batch_slots(plen, per_device_batch)
    tails = {
        q: _tail(model, q, plen, sampled, per_device_batch, world_size, num_steps, usable_mib)
        for q in {criterion, "allocated"}
    }
    slots = {q: int(np.quantile(sampled, q, method="higher")) for q in QUANTILES}
    typical = [
        _row(model, per_device_batch, slots[q], usable_mib, quantile_batch(q), criterion)
        for q in QUANTILES
    ]
    worst = int(np.sort(plen)[::-1][:per_device_batch].sum())
    levels = np.unique(sampled)
    cdf = np.searchsorted(np.sort(sampled), levels, side="right") / len(sampled)
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
        worst_batch=_row(
            model, per_device_batch, worst, usable_mib, "holding the longest events", criterion
        ),
        typical_batches=typical,
        curve={"batch_slots": levels.tolist(), "p_batch_slots_at_most": cdf.tolist()},
        batching="packed",
    )
