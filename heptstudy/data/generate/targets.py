"""Truth targets of the hits data set: the properties of each particle that left a hit
(``ytarget`` row layout), and which hit carries them."""

from __future__ import annotations

import numpy as np

from heptstudy.data.tfds import Y_WIDTH

MIN_TRACK_HITS = 4  # pf data set: a charged particle with this many tracker hits has a track


def particle_targets(
    parts: dict[str, np.ndarray], n_trk: np.ndarray, n_cal: np.ndarray, jet_idx: np.ndarray
) -> np.ndarray:
    """Target row [n_particles, Y_WIDTH] of every particle; those with a hit are numbered 1..P
    in generator order (column 13, 0 for the others)."""
    has_hit = (n_trk + n_cal) > 0
    number = np.zeros(len(has_hit), dtype=np.int64)
    number[has_hit] = np.arange(1, has_hit.sum() + 1)
    props = np.zeros((len(has_hit), Y_WIDTH))
    props[:, 0] = parts["cls"]
    props[:, 1] = parts["charge"]
    props[:, 2] = parts["pt"]
    props[:, 3] = parts["eta"]
    props[:, 4] = np.sin(parts["phi"])
    props[:, 5] = np.cos(parts["phi"])
    props[:, 6] = parts["energy"]
    props[:, 7] = 0.0  # ispu
    props[:, 8] = 1.0  # generatorStatus: final state
    props[:, 9] = (n_trk > 0) * 1 + (n_cal > 0) * 2  # simulatorStatus (synthetic bitmask)
    props[:, 10] = n_trk >= MIN_TRACK_HITS
    props[:, 11] = n_cal > 0
    props[:, 12] = jet_idx
    props[:, 13] = number
    return props


def hit_targets(
    X: np.ndarray, owner: np.ndarray, is_trk: np.ndarray, props: np.ndarray
) -> np.ndarray:
    """Target row [n_hits, Y_WIDTH] of every hit: a hit of a particle carries its
    particle_number; one representative hit per particle carries all its properties."""
    n_hits = len(X)
    ytarget = np.zeros((n_hits, props.shape[1]))
    ok = owner >= 0
    ytarget[ok, 13] = props[owner[ok], 13]
    rep = np.full(len(props), -1, dtype=np.int64)
    hit_idx = np.arange(n_hits)
    # innermost tracker hits first, then the most energetic calorimeter hits of the rest
    for sel, key in ((ok & is_trk, np.hypot(X[:, 6], X[:, 7])), (ok & ~is_trk, -X[:, 5])):
        if sel.any():
            order = np.lexsort((key[sel], owner[sel]))
            ow, hi = owner[sel][order], hit_idx[sel][order]
            first = np.r_[True, ow[1:] != ow[:-1]]
            need = rep[ow[first]] < 0
            rep[ow[first][need]] = hi[first][need]
    reps = np.flatnonzero(rep >= 0)
    ytarget[rep[reps]] = props[reps]
    return ytarget
