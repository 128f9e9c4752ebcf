"""Calorimeter and muon-system hits: showers, MIP hits, muon-system hits and background, snapped
to cells (5 mm ECAL, 30 mm HCAL), contributions to one cell merged."""

from __future__ import annotations

import math

import numpy as np

from heptstudy.data.generate import detector as det
from heptstudy.data.generate.particles import orthonormal

Block = tuple[np.ndarray, np.ndarray]  # hits, owner particle index (-1: none)


def calo_hits(rng, parts: dict[str, np.ndarray], occ: float) -> Block:
    """Shower, MIP and background hits in ECAL, HCAL and muon system; hits and owner (-1: none)."""
    absid = np.abs(parts["pid"])
    energy = parts["energy"]
    axis, barrel, reaches = calo_entry(parts, np.arange(len(absid)))
    em = reaches & ((absid == 22) | (absid == 11))
    had = reaches & ((absid == 211) | (absid == 130))
    mu = reaches & (absid == 13)
    thin = min(occ, 1.0)
    blocks = _em_showers(rng, em, energy, axis, barrel, occ)
    start = rng.exponential(1.0, len(absid))  # hadronic shower start, interaction lengths
    blocks += _hadron_showers(rng, had, start, energy, axis, barrel, occ)
    blocks += _mip_hits(rng, mu, had & (parts["charge"] != 0), start, axis, barrel, thin)
    blocks += _muon_system_hits(rng, mu & (energy > 3.0), axis, thin)
    blocks += _background(rng, occ)
    if not blocks:
        return det.hits_array(0), np.zeros(0, dtype=np.int64)
    return merge_cells(
        np.concatenate([b[0] for b in blocks]), np.concatenate([b[1] for b in blocks])
    )


def _share(rng, owner: np.ndarray, total: np.ndarray, shape: float = 0.6) -> np.ndarray:
    """Split ``total[owner]`` among each owner's hits with Gamma-distributed weights."""
    w = rng.gamma(shape, 1.0, len(owner))
    s = np.bincount(owner, weights=w, minlength=len(total))
    return total[owner] * w / np.maximum(s[owner], 1e-12)


def _em_showers(rng, em, energy, axis, barrel, occ: float) -> list[Block]:
    """Longitudinal Gamma profile peaking near ln(E) in the ECAL."""
    n_em = np.where(em, rng.poisson(det.EM_HITS_PER_GEV * occ * energy**det.EM_POWER), 0)
    own = np.repeat(np.arange(len(em)), n_em)
    if not len(own):
        return []
    shape = 2.0 + 0.6 * np.log(np.maximum(energy[own], 0.1) / 0.01)
    layer = np.minimum(rng.gamma(shape, 1.6), det.ECAL_LAYERS - 1).astype(int)
    edep = energy * np.clip(1 + rng.normal(0, 0.15 / np.sqrt(energy)), 0.3, 2.0)
    e_hit = _share(rng, own, edep)
    return [(calo_block(rng, own, axis, barrel, layer, "ecal", e_hit, 9.0, 0), own)]


def _hadron_showers(rng, had, start, energy, axis, barrel, occ: float) -> list[Block]:
    """Showers starting at depth ``start`` (lambda); the ECAL is 1 lambda deep, the HCAL 5.5."""
    n_had = np.where(had, rng.poisson(det.HAD_HITS_PER_GEV * occ * energy**det.HAD_POWER), 0)
    own = np.repeat(np.arange(len(had)), n_had)
    if not len(own):
        return []
    depth = start[own] + rng.gamma(2.0, 0.7, len(own))  # lambda
    in_ecal = depth < 1.0
    edep = energy * np.clip(0.85 + rng.normal(0, 0.5 / np.sqrt(energy)), 0.1, 1.5)
    e_hit = _share(rng, own, edep)
    le = np.minimum((depth / 1.0 * det.ECAL_LAYERS), det.ECAL_LAYERS - 1).astype(int)
    lh = np.minimum(((depth - 1.0) / 5.5 * det.HCAL_LAYERS), det.HCAL_LAYERS - 1).astype(int)
    blocks = []
    for m, calo, layer, spread in ((in_ecal, "ecal", le, 25.0), (~in_ecal, "hcal", lh, 60.0)):
        if m.any():
            layer = np.maximum(layer[m], 0)
            blocks.append(
                (calo_block(rng, own[m], axis, barrel, layer, calo, e_hit[m], spread, 1), own[m])
            )
    return blocks


def _mip_hits(rng, mu, charged_had, start, axis, barrel, thin: float) -> list[Block]:
    """One hit per layer: muons everywhere, charged hadrons before their shower starts."""
    idx = np.arange(len(mu))
    mip_ecal_layers = np.where(
        mu, det.ECAL_LAYERS, np.where(charged_had, np.minimum(start, 1.0) * det.ECAL_LAYERS, 0)
    ).astype(int)
    blocks = []
    for calo, nl_of, e_mip in (
        ("ecal", mip_ecal_layers, 0.005),
        ("hcal", np.where(mu, det.HCAL_LAYERS, 0), 0.025),
    ):
        own = np.repeat(idx, nl_of)
        if not len(own):
            continue
        first = np.concatenate([[0], np.cumsum(nl_of)[:-1]])
        layer = np.arange(len(own)) - np.repeat(first, nl_of)
        keep = rng.random(len(own)) < thin
        own, layer = own[keep], layer[keep]
        e = e_mip * (1 + rng.exponential(0.3, len(own)))
        blocks.append((calo_block(rng, own, axis, barrel, layer, calo, e, 2.0, 2), own))
    return blocks


def _muon_system_hits(rng, selected, axis, thin: float) -> list[Block]:
    """One hit per muon-system layer (thinned when occupancy < 1) for the ``selected`` muons."""
    m_idx = np.flatnonzero(selected)
    if not len(m_idx):
        return []
    own = np.repeat(m_idx, det.MUON_LAYERS)
    layer = np.tile(np.arange(det.MUON_LAYERS), len(m_idx))
    keep = rng.random(len(own)) < thin
    own, layer = own[keep], layer[keep]
    r_l = det.MUON_R[0] + (layer + 0.5) / det.MUON_LAYERS * (det.MUON_R[1] - det.MUON_R[0])
    sin_t = np.hypot(axis[own, 0], axis[own, 1])
    pos = (r_l / np.maximum(sin_t, 0.3))[:, None] * axis[own]
    pos = np.round(pos / det.MUON_CELL) * det.MUON_CELL
    h = det.hits_array(len(own))
    det.fill_geometry(
        h, pos, 0.002 * np.ones(len(own)), np.linalg.norm(pos, axis=1) / det.C_MM_PER_NS, True
    )
    h[:, 0] = 2
    h[:, 10] = det.SUBDET_MUON
    h[:, 11] = 2
    h[:, 12] = det.SYSTEM_MUON
    h[:, 14] = layer
    return [(h, own)]


def _background(rng, occ: float) -> list[Block]:
    """Low-energy hits (gamma gamma -> hadrons, pairs), mostly forward, log-normal count."""
    n_bkg = rng.poisson(det.BKG_CALO_MEDIAN * occ * math.exp(rng.normal(0, det.BKG_SIGMA)))
    if not n_bkg:
        return []
    eta = rng.normal(0, 1.9, n_bkg)
    phi = rng.uniform(-np.pi, np.pi, n_bkg)
    theta = 2 * np.arctan(np.exp(-eta))
    ax = np.stack([np.sin(theta) * np.cos(phi), np.sin(theta) * np.sin(phi), np.cos(theta)], 1)
    cot = ax[:, 2] / np.maximum(np.hypot(ax[:, 0], ax[:, 1]), 1e-9)
    bar = np.abs(det.ECAL_R[0] * cot) < det.ECAL_HALF_Z
    hcal = rng.random(n_bkg) < 0.4
    e = rng.exponential(0.004, n_bkg)
    blocks = []
    for calo, m, nl in (("ecal", ~hcal, det.ECAL_LAYERS), ("hcal", hcal, det.HCAL_LAYERS)):
        if m.any():
            layer = rng.integers(0, nl, m.sum())
            h = calo_block(rng, np.arange(m.sum()), ax[m], bar[m], layer, calo, e[m], 0.0, 3)
            blocks.append((h, np.full(m.sum(), -1)))
    return blocks


def calo_entry(parts: dict[str, np.ndarray], idx: np.ndarray):
    """Unit shower axis, whether in the barrel, and whether the calorimeter is reached at all."""
    mom = parts["mom"][idx]
    pt = parts["pt"][idx]
    q = parts["charge"][idx]
    cot = mom[:, 2] / pt
    barrel = np.abs(det.ECAL_R[0] * cot) < det.ECAL_HALF_Z
    r_entry = np.where(barrel, det.ECAL_R[0], np.abs(det.ECAL_Z[0] / np.where(cot == 0, 1e-9, cot)))
    radius = pt / (0.3 * det.B_FIELD) * 1000.0
    bend = np.where(q != 0, np.arcsin(np.clip(r_entry / (2 * radius), 0, 1)), 0.0)
    phi = parts["phi"][idx] - q * bend
    theta = np.arctan2(pt, mom[:, 2])
    axis = np.stack([np.sin(theta) * np.cos(phi), np.sin(theta) * np.sin(phi), np.cos(theta)], 1)
    reaches = (q == 0) | (2 * radius > r_entry)
    return axis, barrel, reaches


def _layer_position(axis, barrel, depth_frac, calo: str):
    """Point on the shower axis at fractional depth (0..1) through the ECAL or HCAL."""
    (r0, r1), (z0, z1) = (det.ECAL_R, det.ECAL_Z) if calo == "ecal" else (det.HCAL_R, det.HCAL_Z)
    sin_t = np.hypot(axis[:, 0], axis[:, 1])
    cos_t = axis[:, 2]
    r_l = r0 + depth_frac * (r1 - r0)
    z_l = z0 + depth_frac * (z1 - z0)
    t = np.where(barrel, r_l / np.maximum(sin_t, 1e-6), z_l / np.maximum(np.abs(cos_t), 1e-6))
    return t[:, None] * axis


def calo_block(rng, owner, axis, barrel, layer, calo, energy, spread_mm, kind) -> np.ndarray:
    """Hits of the owners in one layer, spread around the shower axis and snapped to cells."""
    n = len(owner)
    nl = det.ECAL_LAYERS if calo == "ecal" else det.HCAL_LAYERS
    frac = (layer + 0.5) / nl
    centre = _layer_position(axis[owner], barrel[owner], frac, calo)
    e1, e2 = orthonormal(axis[owner])
    rad = rng.exponential(1.0, n) * spread_mm
    ang = rng.uniform(-np.pi, np.pi, n)
    pos = centre + (rad * np.cos(ang))[:, None] * e1 + (rad * np.sin(ang))[:, None] * e2
    cell = det.ECAL_CELL if calo == "ecal" else det.HCAL_CELL
    pos = np.round(pos / cell) * cell + cell / 2
    r3 = np.linalg.norm(pos, axis=1)
    t = r3 / det.C_MM_PER_NS + rng.exponential(0.3 if kind != 1 else 2.0, n)
    h = det.hits_array(n)
    det.fill_geometry(h, pos, energy, t, unit_scale=True)
    h[:, 0] = 2
    is_barrel = barrel[owner]
    if calo == "ecal":
        h[:, 10] = det.SUBDET_ECAL
        h[:, 11] = 0
        h[:, 12] = np.where(is_barrel, det.SYSTEM_ECAL_BARREL, det.SYSTEM_ECAL_ENDCAP)
    else:
        h[:, 10] = det.SUBDET_HCAL
        h[:, 11] = 1
        h[:, 12] = np.where(is_barrel, det.SYSTEM_HCAL_BARREL, det.SYSTEM_HCAL_ENDCAP)
    h[:, 13] = np.where(is_barrel, 0, np.sign(pos[:, 2]))
    h[:, 14] = layer
    return h


def merge_cells(h: np.ndarray, owner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One hit per cell: energies summed, earliest time, the rest from the most energetic."""
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
