"""Tracker hits where charged particles' helices cross barrel layers and endcap disks (within
acceptance and efficiency), plus beam-induced background."""

from __future__ import annotations

import math

import numpy as np

from heptstudy.data.generate import detector as det
from heptstudy.data.generate.detector import BARREL, DISKS


def tracker_hits(rng, parts: dict[str, np.ndarray], occ: float):
    """Helix crossings of charged particles with barrel layers and disks; hits, owner index."""
    charged = np.flatnonzero(parts["charge"] != 0)
    if len(charged) == 0:
        return det.hits_array(0), np.zeros(0, dtype=np.int64)
    q = parts["charge"][charged][:, None]
    pt = parts["pt"][charged][:, None]
    phi0 = parts["phi"][charged][:, None]
    cot = (parts["mom"][charged, 2] / parts["pt"][charged])[:, None]
    beta = (np.linalg.norm(parts["mom"][charged], axis=1) / parts["energy"][charged])[:, None]
    radius = pt / (0.3 * det.B_FIELD) * 1000.0  # mm
    z0 = rng.normal(0.0, 0.02, (len(charged), 1))
    blocks = []
    # barrel layers [P, L]
    r_l = BARREL[None, :, 2]
    ratio = r_l / (2 * radius)
    reach = ratio < 1.0
    alpha = np.arcsin(np.clip(ratio, 0, 1))
    s = 2 * radius * alpha
    z = z0 + s * cot
    ok = reach & (np.abs(z) < BARREL[None, :, 3])
    pi, li = np.nonzero(ok)
    phi = phi0[pi, 0] - q[pi, 0] * alpha[pi, li] + rng.normal(0, 0.005 / r_l[0, li])
    pos = np.stack([r_l[0, li] * np.cos(phi), r_l[0, li] * np.sin(phi), z[pi, li]], axis=1)
    blocks.append((pi, pos, BARREL[li, 0], BARREL[li, 1], np.zeros(len(li)), s[pi, li], z[pi, li]))
    # disks [P, D]
    zd = DISKS[None, :, 2]
    s_d = (zd - z0) / np.where(np.abs(cot) < 1e-9, 1e-9, cot)
    turn = s_d / (2 * radius)
    r_d = 2 * radius * np.sin(np.clip(turn, 0, np.pi / 2))
    ok = (s_d > 0) & (turn < np.pi / 2) & (r_d >= DISKS[None, :, 3]) & (r_d <= DISKS[None, :, 4])
    pi, di = np.nonzero(ok)
    phi = phi0[pi, 0] - q[pi, 0] * turn[pi, di]
    rr = r_d[pi, di]
    pos = np.stack([rr * np.cos(phi), rr * np.sin(phi), zd[0, di]], axis=1)
    blocks.append(
        (pi, pos, DISKS[di, 0], DISKS[di, 1], DISKS[di, 5], s_d[pi, di], zd[0, di] - z0[pi, 0])
    )
    owner, pos, system, layer, side, s_path, z_path = (
        np.concatenate(c) for c in zip(*blocks, strict=True)
    )
    path = np.hypot(s_path, z_path)
    keep = rng.random(len(owner)) < det.TRACKER_EFFICIENCY * min(occ, 1.0)
    owner, pos, system, layer, side, path = (
        a[keep] for a in (owner, pos, system, layer, side, path)
    )
    edep = 8e-5 * (1.0 + rng.exponential(0.3, len(owner)))  # GeV, Landau-like tail
    t = path / (det.C_MM_PER_NS * beta[owner, 0]) + rng.normal(0, 0.05, len(owner))
    h = det.hits_array(len(owner))
    det.fill_geometry(h, pos, edep, t, unit_scale=False)
    h[:, 0] = 1
    h[:, 10] = det.SUBDET_TRACKER
    h[:, 11] = 0
    h[:, 12] = system
    h[:, 13] = side
    h[:, 14] = layer
    return h, charged[owner]


def tracker_background(rng, occ: float) -> np.ndarray:
    """Beam-induced hits, 70 % in the vertex detector, log-normal count per event."""
    n = rng.poisson(det.BKG_TRACKER_MEDIAN * occ * math.exp(rng.normal(0, det.BKG_SIGMA)))
    h = det.hits_array(n)
    if not n:
        return h
    in_vtx = rng.random(n) < 0.7
    li = np.where(in_vtx, rng.integers(0, 6, n), rng.integers(6, len(BARREL), n))
    r = BARREL[li, 2]
    z = rng.uniform(-1, 1, n) * BARREL[li, 3]
    phi = rng.uniform(-np.pi, np.pi, n)
    pos = np.stack([r * np.cos(phi), r * np.sin(phi), z], 1)
    det.fill_geometry(h, pos, 5e-5 * (1 + rng.exponential(0.5, n)), rng.uniform(-1, 5, n), False)
    h[:, 0] = 1
    h[:, 10] = det.SUBDET_TRACKER
    h[:, 12] = BARREL[li, 0]
    h[:, 14] = BARREL[li, 1]
    return h
