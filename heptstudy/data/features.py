"""Tracker-neighbourhood features: summaries of the tracker hits around every hit in (eta, phi).

For each hit (tracker or calorimeter) and radii ``r_1 < ... < r_K`` the block holds
``K + 3`` columns:

* ``count_k``: number of *other* tracker hits within distance ``r_k``;
* ``mean_radius``: mean transverse radius (metres) of the other tracker hits within the largest
  radius (0 when there are none);
* ``radius_spread``: their standard deviation (metres; 0 when fewer than two);
* ``nearest``: distance to the nearest other tracker hit, capped at ``NEAREST_CAP``.

The distance is ``sqrt(deta^2 + dphi^2)`` with ``dphi`` wrapped into ``[-pi, pi]`` (a periodic
k-d tree, ``scipy.spatial.cKDTree(boxsize=...)``), phi read as ``atan2(sin_phi, cos_phi)`` so a
common positive factor on the two columns does not matter.  Cost O(N log N + pairs): one
dual-tree pair listing at the largest radius (``sparse_distance_matrix``), bincounts over the
pairs, and a capped nearest-neighbour query only for the hits with no other tracker hit within
the largest radius.  The pair count grows roughly with the square of the largest radius (about
62k pairs per full-occupancy event at 0.05, 285k at 0.2), so the largest radius sets the cost.

Default radii (``model.tracker_features.radii``) are ``[0.02, 0.05]``: 0.02 is a few ECAL cells
(5 mm at ~2.1 m) around a hit, the scale of an electromagnetic shower core; 0.05 is a few HCAL cells
and covers the offset between a track's outer tracker hits and its calorimeter entry point for
tracks above roughly 1 GeV.  The earlier 0.2 (half a jet cone) measured jet-scale activity, which
the backbone's attention sees anyway, at about twice the per-event cost (the input path fell to
~50 events per CPU-second); the nearest-hit column still reaches out to ``NEAREST_CAP``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.spatial import cKDTree

#: Nearest-tracker-hit distances at or above this are reported as this value.
NEAREST_CAP = 1.0
TRACKER = 1  # elemtype of tracker hits
ETA, SIN_PHI, COS_PHI, POS_X, POS_Y = 2, 3, 4, 6, 7


def hit_phi(X: np.ndarray) -> np.ndarray:
    """phi of every row, ``atan2(sin_phi, cos_phi)``: invariant to a common positive factor."""
    return np.arctan2(X[:, SIN_PHI], X[:, COS_PHI])


def feature_names(radii: Sequence[float]) -> list[str]:
    return [f"count_r{r:g}" for r in radii] + ["mean_radius", "radius_spread", "nearest"]


def tracker_neighbourhood(X: np.ndarray, radii: Sequence[float]) -> np.ndarray:
    """The ``[N, len(radii) + 3]`` float32 neighbourhood block of the hits ``X [N, 15]``."""
    radii = [float(r) for r in radii]
    if not radii or min(radii) <= 0:
        raise ValueError(f"radii must be positive, got {radii}")
    X = np.asarray(X)
    n, k = len(X), len(radii)
    out = np.zeros((n, k + 3), dtype=np.float32)
    if n == 0:
        return out
    out[:, -1] = NEAREST_CAP
    trk = np.flatnonzero(X[:, 0] == TRACKER)
    nt = len(trk)
    if nt == 0:
        return out
    r_hi = max(radii)
    eta = X[:, ETA].astype(np.float64)
    phi = np.mod(hit_phi(X).astype(np.float64), 2 * np.pi)
    phi[phi >= 2 * np.pi] = 0.0  # mod can round up to exactly 2 pi
    eta0 = eta.min()
    pts = np.empty((n, 2))
    pts[:, 0] = eta - eta0
    pts[:, 1] = phi
    # wider in eta than any query (no wrap there), periodic in phi
    box = np.array([(eta.max() - eta0) + 2 * max(r_hi, NEAREST_CAP) + 1.0, 2 * np.pi])
    fast = {"balanced_tree": False, "compact_nodes": False}  # quicker to build, same answers
    tree_all = cKDTree(pts, boxsize=box, **fast)
    tree_trk = cKDTree(pts[trk], boxsize=box)  # few points: a balanced tree queries faster

    # all (hit, tracker hit) pairs within the largest radius, zero distances (and so each tracker
    # hit with itself) included; self pairs are taken out below by subtraction
    pairs = tree_all.sparse_distance_matrix(tree_trk, r_hi, output_type="ndarray")
    i, jt, d = pairs["i"], pairs["j"], pairs["v"]
    del pairs
    cnt = np.bincount(i, minlength=n).astype(np.float64)
    cnt[trk] -= 1.0
    for c, r in enumerate(radii):
        if r == r_hi:
            out[:, c] = cnt
        else:
            cr = np.bincount(i[d <= r], minlength=n).astype(np.float64)
            cr[trk] -= 1.0
            out[:, c] = cr
    rad_trk = np.hypot(X[trk, POS_X].astype(np.float64), X[trk, POS_Y].astype(np.float64))
    rad_trk /= 1000.0
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

    # nearest other tracker hit: from the pairs where there are any (a self pair has i equal to
    # its tracker hit's row), else a tree query capped at NEAREST_CAP (k=2 for tracker hits,
    # whose first answer is the hit itself: any other hit at distance 0 would be in the pairs)
    nearest = np.full(n, np.inf)
    d[trk[jt] == i] = np.inf
    np.minimum.at(nearest, i, d)
    rest = np.flatnonzero(cnt == 0)
    if len(rest):
        is_trk = np.zeros(n, dtype=bool)
        is_trk[trk] = True
        rest_trk = is_trk[rest]
        calo, lone = rest[~rest_trk], rest[rest_trk]
        if len(calo):
            nearest[calo] = tree_trk.query(pts[calo], k=1, distance_upper_bound=NEAREST_CAP)[0]
        if len(lone) and nt > 1:
            dist = tree_trk.query(pts[lone], k=2, distance_upper_bound=NEAREST_CAP)[0]
            nearest[lone] = dist[:, 1]
    out[:, -1] = np.minimum(nearest, NEAREST_CAP)
    return out


def brute_force_neighbourhood(X: np.ndarray, radii: Sequence[float]) -> np.ndarray:
    """Reference O(N^2) implementation of :func:`tracker_neighbourhood` (for tests)."""
    X = np.asarray(X, dtype=np.float64)
    n, k = len(X), len(radii)
    out = np.zeros((n, k + 3))
    out[:, -1] = NEAREST_CAP
    trk = np.flatnonzero(X[:, 0] == TRACKER)
    phi = hit_phi(X)
    rad = np.hypot(X[:, POS_X], X[:, POS_Y]) / 1000.0
    for a in range(n):
        others = trk[trk != a]
        if len(others) == 0:
            continue
        deta = X[others, ETA] - X[a, ETA]
        dphi = np.angle(np.exp(1j * (phi[others] - phi[a])))
        d = np.hypot(deta, dphi)
        for c, r in enumerate(radii):
            out[a, c] = (d <= r).sum()
        sel = d <= max(radii)
        if sel.any():
            out[a, k] = rad[others[sel]].mean()
            out[a, k + 1] = rad[others[sel]].std() if sel.sum() > 1 else 0.0
        out[a, -1] = min(d.min(), NEAREST_CAP)
    return out.astype(np.float32)
