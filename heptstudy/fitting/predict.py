"""Will it fit? Per-batch peaks over the sampler's batching, failure probability and counts.

Every step, each of the ``world_size`` ranks takes the next ``per_device_batch`` events of its
slice of the interleaved-shard order (:class:`heptstudy.data.sampler.InterleavedShardSampler`,
continuing into the next epoch like the training loader), pads them to the longest one, and
the step's peak on that rank is the memory model at (B, longest padded event). A step fails when
any rank's peak exceeds the usable memory (device memory less the safety margin); the first
failure ends the run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from heptstudy.data.batching import padded_sizes
from heptstudy.fitting.memmodel import GIB, MIB, MemoryModel

#: Steps simulated when the scenario has more: enough for a stable probability (the sampling is
#: exact; the expected count in the scenario's steps is probability x steps).
MAX_SIMULATED_STEPS = 5000
MAX_EPOCHS = 200


def batch_longest(
    lengths,
    per_device_batch: int,
    *,
    world_size: int = 1,
    seed: int = 0,
    num_steps: int = 1,
    shard_sizes=None,
    mode: str = "interleaved_shards",
    pad_to_multiple: int = 1,
) -> np.ndarray:
    """Longest padded event of every rank's batch: ``[steps, world_size]`` for the first
    ``num_steps`` steps of the sampler (epochs follow one another)."""
    from heptstudy.data.sampler import InterleavedShardSampler

    plen = padded_sizes(lengths, pad_to_multiple)
    shard_sizes = list(shard_sizes) if shard_sizes is not None else [len(plen)]
    per_rank = max(1, len(plen) // world_size)
    # small data sets: at most MAX_EPOCHS epochs simulated (each epoch costs a shuffle)
    num_steps = max(1, min(num_steps, -(-MAX_EPOCHS * per_rank // per_device_batch)))
    need = num_steps * per_device_batch
    out = np.empty((num_steps, world_size), dtype=np.int64)
    for rank in range(world_size):
        s = InterleavedShardSampler(
            shard_sizes, seed=seed, rank=rank, world_size=world_size, mode=mode
        )
        chunks, have, epoch = [], 0, 0
        while have < need:
            idx = s.epoch_indices(epoch)
            if len(idx) == 0:
                break
            chunks.append(idx[: need - have])
            have += len(chunks[-1])
            epoch += 1
        flat = np.concatenate(chunks)
        out[:, rank] = plen[flat].reshape(num_steps, per_device_batch).max(axis=1)
    return out


@dataclass
class FitAnswer:
    per_device_batch: int
    device_memory_gib: float
    safety_margin_gib: float
    usable_gib: float
    simulated_steps: int
    scenario_steps: int
    world_size: int
    peaks_gib: dict[str, float]  # distribution of per-batch peaks: min, p50, p90, p99, max, mean
    worst_batch: dict[str, Any]  # worst batch met in the simulated steps
    worst_possible: dict[str, Any]  # a batch holding the longest event of the data set
    p_batch_exceeds: float
    p_step_fails: float
    failing_steps_simulated: int
    expected_failures: float
    largest_safe_batch: int | None
    spare_gib_at_worst: float
    histogram: dict[str, list[float]] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return self.expected_failures < 0.5 and self.failing_steps_simulated == 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fits": self.fits}


def evaluate(
    model: MemoryModel,
    lengths,
    per_device_batch: int,
    device_memory_gib: float,
    *,
    safety_margin_gib: float = 0.0,
    world_size: int = 1,
    seed: int = 0,
    num_steps: int = 1,
    shard_sizes=None,
    mode: str = "interleaved_shards",
    pad_to_multiple: int = 1,
    search_largest: bool = True,
    max_simulated_steps: int = MAX_SIMULATED_STEPS,
) -> FitAnswer:
    usable_mib = (device_memory_gib - safety_margin_gib) * GIB / MIB
    sim = max(1, min(num_steps, max_simulated_steps))
    kw = dict(
        world_size=world_size,
        seed=seed,
        shard_sizes=shard_sizes,
        mode=mode,
        pad_to_multiple=pad_to_multiple,
    )
    longest = batch_longest(lengths, per_device_batch, num_steps=sim, **kw)
    sim = longest.shape[0]
    peaks = np.asarray(
        model.predict_allocated_mib(per_device_batch, longest), dtype=float
    )  # [steps, ranks]
    exceeds = peaks > usable_mib
    step_fails = exceeds.any(axis=1)
    p_batch = float(exceeds.mean())
    p_step = float(step_fails.mean())
    w = np.unravel_index(int(np.argmax(peaks)), peaks.shape)
    lmax = int(padded_sizes(lengths, pad_to_multiple).max())
    worst_possible_mib = float(model.predict_allocated_mib(per_device_batch, lmax))
    flat = peaks.ravel() / 1024
    counts, edges = np.histogram(flat, bins=30)
    largest = (
        largest_safe_batch(
            model,
            lengths,
            device_memory_gib,
            safety_margin_gib=safety_margin_gib,
            num_steps=num_steps,
            max_simulated_steps=max_simulated_steps,
            **kw,
        )
        if search_largest
        else None
    )
    return FitAnswer(
        per_device_batch=per_device_batch,
        device_memory_gib=device_memory_gib,
        safety_margin_gib=safety_margin_gib,
        usable_gib=usable_mib * MIB / GIB,
        simulated_steps=sim,
        scenario_steps=num_steps,
        world_size=world_size,
        peaks_gib={
            "min": float(flat.min()),
            "p50": float(np.percentile(flat, 50)),
            "p90": float(np.percentile(flat, 90)),
            "p99": float(np.percentile(flat, 99)),
            "max": float(flat.max()),
            "mean": float(flat.mean()),
        },
        worst_batch={
            "step": int(w[0]),
            "rank": int(w[1]),
            "longest_padded": int(longest[w]),
            "padded_batch_hits": int(longest[w]) * per_device_batch,
            "peak_gib": float(peaks[w]) / 1024,
        },
        worst_possible={
            "longest_padded": lmax,
            "padded_batch_hits": lmax * per_device_batch,
            "peak_gib": worst_possible_mib / 1024,
        },
        p_batch_exceeds=p_batch,
        p_step_fails=p_step,
        failing_steps_simulated=int(step_fails.sum()),
        expected_failures=p_step * num_steps,
        largest_safe_batch=largest,
        spare_gib_at_worst=(usable_mib - float(peaks[w])) / 1024,
        histogram={"edges_gib": edges.tolist(), "counts": counts.astype(float).tolist()},
    )


def largest_safe_batch(
    model: MemoryModel,
    lengths,
    device_memory_gib: float,
    *,
    safety_margin_gib: float = 0.0,
    num_steps: int = 1,
    max_simulated_steps: int = MAX_SIMULATED_STEPS,
    upper: int = 4096,
    **kw,
) -> int | None:
    """Largest per-device batch with no failing step in the simulated steps (and fewer than 0.5
    expected in ``num_steps``); ``None`` when even one event does not fit. Binary search: the
    peak grows with the batch size (the per-hit and per-event terms are non-negative)."""
    usable_mib = (device_memory_gib - safety_margin_gib) * GIB / MIB

    def ok(b: int) -> bool:
        # at most ~2 million events per rank simulated per candidate
        sim = max(1, min(num_steps, max_simulated_steps, 2_000_000 // b))
        longest = batch_longest(lengths, b, num_steps=sim, **kw)
        fails = (np.asarray(model.predict_allocated_mib(b, longest)) > usable_mib).any(axis=1)
        return not fails.any() and fails.mean() * num_steps < 0.5

    # Not capped at the events per rank of the data set: batches run on across epochs, so a
    # batch larger than an epoch's share simply holds the longest events more than once.
    hi = upper
    if not ok(1):
        return None
    if ok(hi):
        return hi
    lo = 1  # ok(lo) and not ok(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo
