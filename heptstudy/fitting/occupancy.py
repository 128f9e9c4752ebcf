"""How likely a batch, a step and a run are to meet events too long for the memory: the sampler
shuffles, so a batch (step) is ``B`` (``world_size x B``) random events; one ``bad`` fails it."""

from __future__ import annotations

import numpy as np
from scipy.special import gammaln


def _log_choose(n, k):
    n, k = np.asarray(n, dtype=float), np.asarray(k, dtype=float)
    return gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1)


def p_none_drawn(total: int, bad: int, draws: int) -> float:
    """Probability that ``draws`` distinct events out of ``total`` hold none of ``bad``."""
    if bad <= 0 or draws <= 0:
        return 1.0
    if draws > total - bad:
        return 0.0
    return float(np.exp(_log_choose(total - bad, draws) - _log_choose(total, draws)))


def batch_longest_cdf(padded_lengths, batch_size: int, levels) -> np.ndarray:
    """P(the longest padded event of a batch of ``batch_size`` is at most each of ``levels``)."""
    plen = np.sort(np.asarray(padded_lengths, dtype=np.int64))
    n = len(plen)
    n_le = np.searchsorted(plen, np.asarray(levels), side="right")
    if batch_size > n:  # a batch spans epochs: it holds every event
        return (n_le == n).astype(float)
    out = np.exp(_log_choose(n_le, batch_size) - _log_choose(n, batch_size))
    return np.where(n_le >= batch_size, out, 0.0)


def p_step_fails(num_events: int, bad: int, batch_size: int, world_size: int) -> float:
    """Probability that one step (``world_size`` batches of ``batch_size``) holds a bad event."""
    return 1.0 - p_none_drawn(num_events, bad, min(num_events, batch_size * world_size))


def p_run_fails(
    num_events: int, bad: int, batch_size: int, world_size: int, num_steps: int
) -> float:
    """Probability that a run of ``num_steps`` steps meets at least one bad event."""
    if bad <= 0:
        return 0.0
    per_epoch = (num_events // world_size) * world_size
    drawn = num_steps * batch_size * world_size
    full_epochs, rest = divmod(drawn, per_epoch)
    p_ok = p_none_drawn(num_events, bad, rest)
    if full_epochs:
        p_ok *= p_none_drawn(num_events, bad, per_epoch) ** full_epochs
    return 1.0 - p_ok
