"""Calorimeter cells: where a particle enters the calorimeters, hits along its shower axis
snapped to cells (5 mm ECAL, 30 mm HCAL), and merging of contributions to the same cell."""

from __future__ import annotations

import numpy as np

from heptstudy.data.generate.detector import (
    B_FIELD,
    C_MM_PER_NS,
    ECAL_CELL,
    ECAL_HALF_Z,
    ECAL_LAYERS,
    ECAL_R,
    ECAL_Z,
    HCAL_CELL,
    HCAL_LAYERS,
    HCAL_R,
    HCAL_Z,
    SUBDET_ECAL,
    SUBDET_HCAL,
    SYSTEM_ECAL_BARREL,
    SYSTEM_ECAL_ENDCAP,
    SYSTEM_HCAL_BARREL,
    SYSTEM_HCAL_ENDCAP,
)
from heptstudy.data.generate.hits import fill_geometry, hits_array
from heptstudy.data.generate.kinematics import orthonormal


def calo_entry(parts: dict[str, np.ndarray], idx: np.ndarray):
    """Unit shower axis, whether each particle enters the barrel (else an endcap) and whether it
    reaches the calorimeter at all (charged particles curling up inside do not)."""
    mom = parts["mom"][idx]
    pt = parts["pt"][idx]
    q = parts["charge"][idx]
    cot = mom[:, 2] / pt
    barrel = np.abs(ECAL_R[0] * cot) < ECAL_HALF_Z
    r_entry = np.where(barrel, ECAL_R[0], np.abs(ECAL_Z[0] / np.where(cot == 0, 1e-9, cot)))
    radius = pt / (0.3 * B_FIELD) * 1000.0
    bend = np.where(q != 0, np.arcsin(np.clip(r_entry / (2 * radius), 0, 1)), 0.0)
    phi = parts["phi"][idx] - q * bend
    theta = np.arctan2(pt, mom[:, 2])
    axis = np.stack([np.sin(theta) * np.cos(phi), np.sin(theta) * np.sin(phi), np.cos(theta)], 1)
    reaches = (q == 0) | (2 * radius > r_entry)
    return axis, barrel, reaches


def _layer_position(axis, barrel, depth_frac, calo: str):
    """Point on the shower axis at fractional depth (0..1) through the ECAL or HCAL."""
    (r0, r1), (z0, z1) = (ECAL_R, ECAL_Z) if calo == "ecal" else (HCAL_R, HCAL_Z)
    sin_t = np.hypot(axis[:, 0], axis[:, 1])
    cos_t = axis[:, 2]
    r_l = r0 + depth_frac * (r1 - r0)
    z_l = z0 + depth_frac * (z1 - z0)
    t = np.where(barrel, r_l / np.maximum(sin_t, 1e-6), z_l / np.maximum(np.abs(cos_t), 1e-6))
    return t[:, None] * axis


def calo_block(rng, owner, axis, barrel, layer, calo, energy, spread_mm, kind) -> np.ndarray:
    """Hits of the given owners in ``layer`` of the ``calo`` ("ecal" or "hcal"), spread
    exponentially around the shower axis by ``spread_mm`` and snapped to cells; ``kind`` 1
    (hadronic) has a longer time tail."""
    n = len(owner)
    nl = ECAL_LAYERS if calo == "ecal" else HCAL_LAYERS
    frac = (layer + 0.5) / nl
    centre = _layer_position(axis[owner], barrel[owner], frac, calo)
    e1, e2 = orthonormal(axis[owner])
    rad = rng.exponential(1.0, n) * spread_mm
    ang = rng.uniform(-np.pi, np.pi, n)
    pos = centre + (rad * np.cos(ang))[:, None] * e1 + (rad * np.sin(ang))[:, None] * e2
    cell = ECAL_CELL if calo == "ecal" else HCAL_CELL
    pos = np.round(pos / cell) * cell + cell / 2
    r3 = np.linalg.norm(pos, axis=1)
    t = r3 / C_MM_PER_NS + rng.exponential(0.3 if kind != 1 else 2.0, n)
    h = hits_array(n)
    fill_geometry(h, pos, energy, t, unit_scale=True)
    h[:, 0] = 2
    is_barrel = barrel[owner]
    if calo == "ecal":
        h[:, 10] = SUBDET_ECAL
        h[:, 11] = 0
        h[:, 12] = np.where(is_barrel, SYSTEM_ECAL_BARREL, SYSTEM_ECAL_ENDCAP)
    else:
        h[:, 10] = SUBDET_HCAL
        h[:, 11] = 1
        h[:, 12] = np.where(is_barrel, SYSTEM_HCAL_BARREL, SYSTEM_HCAL_ENDCAP)
    h[:, 13] = np.where(is_barrel, 0, np.sign(pos[:, 2]))
    h[:, 14] = layer
    return h


def merge_cells(h: np.ndarray, owner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One hit per calorimeter cell: energies summed, earliest time, features and owner of the
    most energetic contribution (the cell is identified by subdetector and cell position)."""
    if len(h) == 0:
        return h, owner
    key = np.concatenate([h[:, 10:11], np.round(h[:, 6:9], 3)], axis=1)
    _, group = np.unique(key, axis=0, return_inverse=True)
    group = group.reshape(-1)
    n = int(group.max()) + 1
    if n == len(h):
        return h, owner
    order = np.lexsort((-h[:, 5], group))
    first = order[np.r_[True, group[order][1:] != group[order][:-1]]]
    esum = np.bincount(group, weights=h[:, 5], minlength=n)
    tmin = np.full(n, np.inf)
    np.minimum.at(tmin, group, h[:, 9])
    out = h[first].copy()
    g = group[first]
    out[:, 1] *= esum[g] / np.maximum(out[:, 5], 1e-30)
    out[:, 5] = esum[g]
    out[:, 9] = tmin[g]
    return out, owner[first]
