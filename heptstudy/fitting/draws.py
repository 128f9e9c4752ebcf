"""How random batches of a data set fall: the geometries a batch of ``B`` events takes and how
likely each is. Padded batches follow their longest event (exact occupancy); packed batches
their total slots (sampled). The fit and ``auto`` ask both the same questions."""

from __future__ import annotations

import numpy as np

from heptstudy.data.layout import BatchGeometry
from heptstudy.fitting import occupancy

QUANTILES = (0.5, 0.9, 0.99)
MAX_BATCH = 4096
#: Random batches (seeded) drawn for the quantiles and tail of a packed batch's slots.
SAMPLED_BATCHES = 20_000


class PaddedDraws:
    """Every event filled to the batch's longest: a batch's length is its longest event."""

    packed = False
    worst_words = "holding the longest event"

    def __init__(self, plen: np.ndarray, batch: int) -> None:
        self.plen, self.batch = plen, batch
        self.levels = np.unique(plen)
        self.cdf = occupancy.batch_longest_cdf(plen, batch, self.levels)

    def _geometry(self, longest: int) -> BatchGeometry:
        return BatchGeometry(self.batch, self.batch * int(longest), int(longest), False)

    @property
    def worst(self) -> BatchGeometry:
        return self._geometry(self.plen.max())

    def quantiles(self) -> list[BatchGeometry]:
        # the smallest padded length L with P(batch longest <= L) >= q
        at = np.minimum(
            np.searchsorted(self.cdf, np.array(QUANTILES) - 1e-12), len(self.levels) - 1
        )
        return [self._geometry(n) for n in self.levels[at]]

    def distribution(self) -> tuple[list[BatchGeometry], np.ndarray]:
        return [self._geometry(n) for n in self.levels], np.diff(np.concatenate([[0.0], self.cdf]))

    def p_step_fails(self, failing: np.ndarray, world_size: int) -> float:
        """P(a step meets a batch of the ``failing`` geometries): the events that make one."""
        bad = int(np.isin(self.plen, self.levels[failing]).sum())
        return occupancy.p_step_fails(len(self.plen), bad, self.batch, world_size)

    def curve(self, model) -> dict[str, list | None]:
        reserved = model.predict_reserved_mib(self.batch, self.levels)
        return {
            "longest_padded": self.levels.tolist(),
            "p_batch_longest_at_most": self.cdf.tolist(),
            "allocated_gib": (model.predict_allocated_mib(self.batch, self.levels) / 1024).tolist(),
            "reserved_gib": None if reserved is None else (np.asarray(reserved) / 1024).tolist(),
        }

    def tail(self, fits, world_size: int, num_steps: int) -> dict:
        """``fits(batch, length)`` -> bool array: the tail's fields of :class:`~.predict.Tail`."""
        ok = fits(self.batch, self.plen)
        bad = int((~ok).sum())
        p_step = occupancy.p_step_fails(len(self.plen), bad, self.batch, world_size)
        longest = int(self.plen.max())
        return {
            "events_too_long": bad,
            "longest_fitting_padded": int(self.plen[ok].max()) if ok.any() else None,
            "p_step_fails": p_step,
            "p_run_fails": occupancy.p_run_fails(
                len(self.plen), bad, self.batch, world_size, num_steps
            ),
            "expected_failing_steps": p_step * num_steps,
            "largest_safe_batch": _largest(lambda b: bool(fits(b, longest)), len(self.plen)),
            "never_fails": bad == 0,
        }


class PackedDraws:
    """Each event rounded up alone, in one stream: a batch's length is its mean slots."""

    packed = True
    worst_words = "holding the longest events"

    def __init__(self, plen: np.ndarray, batch: int) -> None:
        self.plen, self.batch = plen, batch
        self.desc = np.sort(plen)[::-1]
        if batch >= len(plen):
            self.slots, self.longest = np.full(1, plen.sum()), np.full(1, plen.max())
        else:
            rng = np.random.default_rng(0)
            picks = [
                plen[rng.choice(len(plen), batch, replace=False)] for _ in range(SAMPLED_BATCHES)
            ]
            self.slots = np.array([p.sum() for p in picks])
            self.longest = np.array([p.max() for p in picks])

    def _geometry(self, slots: int, longest: int) -> BatchGeometry:
        return BatchGeometry(self.batch, int(slots), int(longest), True)

    @property
    def worst(self) -> BatchGeometry:
        top = self.desc[: self.batch]
        return self._geometry(top.sum(), top[0])

    def quantiles(self) -> list[BatchGeometry]:
        order = np.argsort(self.slots, kind="stable")
        n = len(order)
        picks = [order[int(np.ceil(q * (n - 1)))] for q in QUANTILES]  # numpy's "higher"
        return [self._geometry(self.slots[i], self.longest[i]) for i in picks]

    def distribution(self) -> tuple[list[BatchGeometry], np.ndarray]:
        levels, first, counts = np.unique(self.slots, return_index=True, return_counts=True)
        geometries = [
            self._geometry(s, self.longest[i]) for s, i in zip(levels, first, strict=True)
        ]
        return geometries, counts / len(self.slots)

    def p_step_fails(self, failing: np.ndarray, world_size: int) -> float:
        _, pmf = self.distribution()
        return 1.0 - (1.0 - float(pmf[failing].sum())) ** world_size

    def curve(self, model) -> dict[str, list]:
        levels = np.unique(self.slots)
        cdf = np.searchsorted(np.sort(self.slots), levels, side="right") / len(self.slots)
        return {"batch_slots": levels.tolist(), "p_batch_slots_at_most": cdf.tolist()}

    def _most_slots(self, fits) -> int | None:
        """The most slots a batch of ``batch`` events may hold."""
        b = self.batch
        if not fits(b, 1.0):
            return None
        hi = int(self.plen.sum())
        while fits(b, hi / b):
            hi *= 2
        return _last_ok(lambda slots: fits(b, slots / b), b, hi)

    def tail(self, fits, world_size: int, num_steps: int) -> dict:
        most = self._most_slots(fits)
        top = np.cumsum(self.desc)
        p_batch = 1.0 if most is None else float((self.slots > most).mean())
        p_step = 1.0 - (1.0 - p_batch) ** world_size
        return {
            "events_too_long": 0 if most is not None else len(self.plen),
            "longest_fitting_padded": most,
            "p_step_fails": p_step,
            "p_run_fails": 1.0 - (1.0 - p_step) ** num_steps,
            "expected_failing_steps": p_step * num_steps,
            "largest_safe_batch": _largest(lambda b: bool(fits(b, top[b - 1] / b)), len(self.plen)),
            "never_fails": most is not None and self.desc[: self.batch].sum() <= most,
        }


def _largest(ok, num_events: int) -> int | None:
    """The largest batch ``ok`` says fits, at most the data's events (a batch of more cannot
    be drawn); ``None``: not even one event. ``ok`` holds for every batch below one it holds for."""
    hi = min(MAX_BATCH, num_events)
    if not ok(1):
        return None
    return hi if ok(hi) else _last_ok(ok, 1, hi)


def _last_ok(ok, lo: int, hi: int) -> int:
    """Bisection: the largest ``n`` in ``[lo, hi)`` that ``ok`` holds for, given ``ok(lo)`` and
    not ``ok(hi)``."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def draws_for(packed: bool, plen: np.ndarray, batch: int) -> PaddedDraws | PackedDraws:
    return PackedDraws(plen, batch) if packed else PaddedDraws(plen, batch)
