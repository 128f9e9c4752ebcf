"""Tracker-neighbourhood features of every hit in (eta, phi): per radius the count of *other*
tracker hits, their transverse radius's mean and spread (m) within the largest, and the nearest's
distance. Default radii ``[0.02, 0.05]``: a shower core, a track-to-calorimeter offset (>~1 GeV)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.spatial import cKDTree

from heptstudy.data.schema import COS_PHI, ETA, SIN_PHI

#: Cap of the nearest-hit distance and largest radius: the phi seam copies reach this far.
NEAREST_CAP = 1.0
TWO_PI = 2 * np.pi
TRACKER = 1  # elemtype of tracker hits
POS_X, POS_Y = 6, 7


def tracker_neighbourhood(X: np.ndarray, radii: Sequence[float]) -> np.ndarray:
    # radii in (0, NEAREST_CAP]: the configuration (model.tracker_features.radii) checks them
    radii = [float(r) for r in radii]
    X = np.asarray(X)
    n, k = len(X), len(radii)
    out = np.zeros((n, k + 3), dtype=np.float32)
    out[:, -1] = NEAREST_CAP
    is_trk = X[:, 0] == TRACKER
    trk = np.flatnonzero(is_trk)
    nt = len(trk)
    if nt == 0:
        return out
    r_hi = max(radii)
    pts = np.empty((n, 2))
    pts[:, 0] = X[:, ETA]
    pts[:, 1] = np.mod(np.arctan2(X[:, SIN_PHI], X[:, COS_PHI], dtype=np.float64), TWO_PI)
    pts[pts[:, 1] >= TWO_PI, 1] = 0.0  # mod can round up to exactly 2 pi

    # seam copies shifted by 2 pi: plain trees are quicker than periodic ones
    tp = pts[trk]
    low, high = tp[:, 1] < NEAREST_CAP, tp[:, 1] > TWO_PI - NEAREST_CAP
    images = np.concatenate([tp, tp[low] + (0.0, TWO_PI), tp[high] - (0.0, TWO_PI)])
    owner = np.concatenate([np.arange(nt), np.flatnonzero(low), np.flatnonzero(high)])
    # leaf sizes measured fastest on full-occupancy events; an unbalanced tree builds quicker
    tree_all = cKDTree(pts, leafsize=64, balanced_tree=False, compact_nodes=False)
    tree_trk = cKDTree(images, leafsize=8)

    # self pairs included; taken out below by subtraction
    pairs = tree_trk.sparse_distance_matrix(tree_all, r_hi, output_type="ndarray")
    i, jt, d = pairs["j"], owner[pairs["i"]], pairs["v"]
    del pairs
    cnt = np.bincount(i, minlength=n).astype(np.float64)
    cnt[trk] -= 1.0
    for c, r in enumerate(radii):
        if r == r_hi:
            out[:, c] = cnt
        else:
            cr = np.bincount(i[d <= r], minlength=n)
            cr[trk] -= 1
            out[:, c] = cr
    rad_trk = np.hypot(X[trk, POS_X], X[trk, POS_Y]).astype(np.float64) / 1000.0
    rad = rad_trk[jt]
    s1 = np.bincount(i, weights=rad, minlength=n)
    s2 = np.bincount(i, weights=rad * rad, minlength=n)
    s1[trk] -= rad_trk
    s2[trk] -= rad_trk**2
    has = cnt > 0
    mean = np.divide(s1, cnt, out=np.zeros(n), where=has)
    var = np.divide(s2, cnt, out=np.zeros(n), where=has) - mean**2
    out[:, k] = mean
    out[:, k + 1] = np.sqrt(np.clip(var, 0.0, None)) * (cnt > 1)

    # nearest: from the pairs where any, else a capped tree query (k=2 skips a tracker hit itself)
    nearest = np.full(n, np.inf)
    d[trk[jt] == i] = np.inf
    np.minimum.at(nearest, i, d)
    rest = np.flatnonzero(~has)
    rest_trk = is_trk[rest]
    calo, lone = rest[~rest_trk], rest[rest_trk]
    if len(calo):
        nearest[calo] = tree_trk.query(pts[calo], k=1, distance_upper_bound=NEAREST_CAP)[0]
    if len(lone) and nt > 1:
        nearest[lone] = tree_trk.query(pts[lone], k=2, distance_upper_bound=NEAREST_CAP)[0][:, 1]
    out[:, -1] = np.minimum(nearest, NEAREST_CAP)
    return out
