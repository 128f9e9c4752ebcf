"""Synthetic CLD-like e+e- -> ttbar events at 365 GeV, written as the real TFDS data sets.

One simulation per event feeds both data sets: ``cld_edm_ttbar_hits`` (one row per tracker or
calorimeter hit) and ``cld_edm_ttbar_pf`` (one row per track or calorimeter cluster).  The model
of the event is deliberately simple but keeps what matters for memory and time measurements: the
number of hits per event and its spread.

* Event: tt̄ decay mode (all-hadronic, semi-leptonic, di-leptonic), top -> b W, W -> q q' or l nu
  with two-body kinematics and Lorentz boosts; each quark fragments into a jet of particles of the
  five target classes (charged hadron, neutral hadron, photon, electron, muon) with multiplicity
  growing with log(E) and Dirichlet energy sharing.  Masses and charges from ``particle``.
* Tracker: charged particles follow helices in a 2 T field through CLD-like barrel layers
  (vertex 13/35/57 mm, double-sided; inner 127/400/670 mm; outer 1000/1568/2136 mm) and endcap
  disks; a hit where the helix crosses a layer inside its acceptance (97 % efficiency), plus
  beam-induced background hits.
* Calorimeters: 40-layer ECAL (barrel r 2150-2352 mm) and 44-layer HCAL (r 2400-3566 mm) with
  endcaps; electromagnetic showers for photons and electrons, hadronic showers (starting point
  exponential in interaction lengths) for hadrons, one MIP hit per layer for muons and for hadrons
  before they shower; hit counts grow with energy; low-energy background hits, mostly forward;
  contributions to the same cell (5 mm ECAL, 30 mm HCAL) merged into one hit.
* ``occupancy_scale`` multiplies the shower and background hit counts; below 1 it also thins the
  tracker and MIP hits with that probability (tests use ~0.03 for a few hundred hits per event).

The constants were calibrated so that, at ``occupancy_scale=1``, the median event has about 900
tracker hits and 8,500 calorimeter hits (the closest published figures are for CLIC ttbar at
380 GeV) with a tail past 13,000 hits.

Conventions of the stored features are documented in ``data/README.md``.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from heptstudy.config import CLASS_PDG_IDS
from heptstudy.data.tfds import (
    CONFIG_NAMES,
    HITS_NAME,
    PF_NAME,
    VERSION,
    X_WIDTH,
    Y_WIDTH,
    ArrayRecordDatasetWriter,
    features_dict,
)
from heptstudy.errors import DataError

GENERATOR_VERSION = "1"
SQRT_S = 365.0  # GeV
B_FIELD = 2.0  # tesla
C_MM_PER_NS = 299.792458
JET_R = 0.4
JET_PTMIN = 5.0  # GeV

# --- tracker geometry (mm): (system, layer, radius, half length) and (system, layer, z, rmin, rmax)
_BARREL = np.array(
    [
        (1, 0, 13.0, 125.0), (1, 1, 14.8, 125.0),
        (1, 2, 35.0, 125.0), (1, 3, 36.8, 125.0),
        (1, 4, 57.0, 125.0), (1, 5, 58.8, 125.0),
        (3, 0, 127.0, 482.0), (3, 1, 400.0, 482.0), (3, 2, 670.0, 692.0),
        (5, 0, 1000.0, 1264.0), (5, 1, 1568.0, 1264.0), (5, 2, 2136.0, 1264.0),
    ]
)  # fmt: skip
_DISKS_Z = [
    (2, 160.0, 25.0, 112.0), (2, 162.0, 25.0, 112.0),
    (2, 230.0, 25.0, 112.0), (2, 232.0, 25.0, 112.0),
    (2, 300.0, 25.0, 112.0), (2, 302.0, 25.0, 112.0),
    (4, 524.0, 60.0, 400.0), (4, 808.0, 85.0, 670.0), (4, 1093.0, 110.0, 670.0),
    (4, 1377.0, 140.0, 670.0), (4, 1661.0, 170.0, 670.0), (4, 1946.0, 200.0, 670.0),
    (4, 2190.0, 220.0, 670.0),
    (6, 1310.0, 700.0, 2136.0), (6, 1617.0, 230.0, 2136.0), (6, 1924.0, 240.0, 2136.0),
    (6, 2190.0, 250.0, 2136.0),
]  # fmt: skip


def _disk_table() -> np.ndarray:
    rows, layer_of = [], {}
    for system, z, rmin, rmax in _DISKS_Z:
        layer = layer_of.get(system, 0)
        layer_of[system] = layer + 1
        for side in (1, -1):
            rows.append((system, layer, side * z, rmin, rmax, side))
    return np.array(rows)


_DISKS = _disk_table()  # columns: system, layer, z, rmin, rmax, side

# --- calorimeters (mm)
ECAL_R = (2150.0, 2352.0)
ECAL_HALF_Z = 2210.0
ECAL_Z = (2307.0, 2509.0)
ECAL_LAYERS = 40
HCAL_R = (2400.0, 3566.0)
HCAL_HALF_Z = 2210.0
HCAL_Z = (2539.0, 3705.0)
HCAL_LAYERS = 44
MUON_R = (4000.0, 6000.0)
MUON_LAYERS = 6
ECAL_CELL, HCAL_CELL, MUON_CELL = 5.0, 30.0, 30.0
SYSTEM_ECAL_BARREL, SYSTEM_ECAL_ENDCAP = 20, 29
SYSTEM_HCAL_BARREL, SYSTEM_HCAL_ENDCAP = 10, 11
SYSTEM_MUON = 13
SUBDET_TRACKER, SUBDET_ECAL, SUBDET_HCAL, SUBDET_MUON = 0, 1, 2, 3

# --- calibration (hit counts)
EM_HITS_PER_GEV = 44.0  # EM shower: hits = k * E**0.9
HAD_HITS_PER_GEV = 22.0  # hadronic shower: hits = k * E**0.9
EM_POWER = HAD_POWER = 0.9
BKG_TRACKER_MEDIAN = 390.0  # beam-induced tracker hits (log-normal per event)
BKG_CALO_MEDIAN = 1700.0  # low-energy calorimeter hits (log-normal per event)
BKG_SIGMA = 0.6
JET_MULT_A, JET_MULT_B = 2.0, 3.4  # particles per quark jet ~ 1 + Poisson(a + b ln E)
SPECIES_P = np.array([0.0, 0.50, 0.11, 0.36, 0.02, 0.01])  # over CLASS_PDG_IDS
TRACKER_EFFICIENCY = 0.97
MIN_TRACK_HITS = 4  # pf data set: a charged particle with this many tracker hits has a track


@functools.cache
def _pdg_facts() -> dict[int, tuple[float, float]]:
    """(mass in GeV, charge) per signed PDG id, from the ``particle`` package."""
    from particle import Particle

    facts = {}
    for pid in CLASS_PDG_IDS[1:] + (12, 14, 5, 24, 6):
        for sign in (1, -1):
            p = Particle.from_pdgid(sign * pid) if pid not in (22, 130) or sign > 0 else None
            if p is None:
                continue
            facts[sign * pid] = (float(p.mass or 0.0) / 1000.0, float(p.charge))
    return facts


def _mass(pid: int) -> float:
    return _pdg_facts()[pid][0]


# ============================================================================================
# Kinematics helpers


def _boost(p4: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """Lorentz-boost four-vectors (E, px, py, pz) [..., 4] by velocity ``beta`` [3]."""
    b2 = float(beta @ beta)
    if b2 < 1e-12:
        return p4.copy()
    gamma = 1.0 / math.sqrt(1.0 - b2)
    bp = p4[..., 1:] @ beta
    g2 = (gamma - 1.0) / b2
    out = np.empty_like(p4)
    out[..., 0] = gamma * (p4[..., 0] + bp)
    out[..., 1:] = p4[..., 1:] + (g2 * bp + gamma * p4[..., 0])[..., None] * beta
    return out


def _random_dir(rng: np.random.Generator, n: int) -> np.ndarray:
    cos = rng.uniform(-1, 1, n)
    phi = rng.uniform(-np.pi, np.pi, n)
    sin = np.sqrt(1 - cos**2)
    return np.stack([sin * np.cos(phi), sin * np.sin(phi), cos], axis=-1)


def _two_body(rng, p4_parent: np.ndarray, m1: float, m2: float) -> tuple[np.ndarray, np.ndarray]:
    m = math.sqrt(max(p4_parent[0] ** 2 - p4_parent[1:] @ p4_parent[1:], (m1 + m2) ** 2 + 1e-9))
    pstar = math.sqrt(max((m**2 - (m1 + m2) ** 2) * (m**2 - (m1 - m2) ** 2), 0.0)) / (2 * m)
    d = _random_dir(rng, 1)[0]
    a = np.concatenate([[math.hypot(pstar, m1)], pstar * d])
    b = np.concatenate([[math.hypot(pstar, m2)], -pstar * d])
    beta = p4_parent[1:] / p4_parent[0]
    return _boost(a, beta), _boost(b, beta)


def _orthonormal(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two unit vectors perpendicular to each row of unit vectors ``u`` [n, 3]."""
    helper = np.where(np.abs(u[:, 2:3]) < 0.9, [[0.0, 0.0, 1.0]], [[1.0, 0.0, 0.0]])
    e1 = np.cross(u, helper)
    e1 /= np.linalg.norm(e1, axis=1, keepdims=True)
    e2 = np.cross(u, e1)
    return e1, e2


# ============================================================================================
# Generator level


def _partons(
    rng: np.random.Generator,
) -> tuple[list[np.ndarray], list[tuple[int, np.ndarray]], np.ndarray]:
    """Quark four-vectors, isolated leptons (pid, p4) and the summed neutrino four-vector."""
    m_t, m_w, m_b = 172.5, 80.4, 4.8
    e_top = SQRT_S / 2
    p_top = math.sqrt(e_top**2 - m_t**2)
    d = _random_dir(rng, 1)[0]
    tops = [np.concatenate([[e_top], p_top * d]), np.concatenate([[e_top], -p_top * d])]
    mode = rng.choice(3, p=[0.457, 0.438, 0.105])  # number of leptonic W: 0, 1, 2
    leptonic = [False, False] if mode == 0 else [True, True] if mode == 2 else [True, False]
    if mode == 1:
        rng.shuffle(leptonic)
    quarks, leptons, nu = [], [], np.zeros(4)
    for top, lep in zip(tops, leptonic, strict=True):
        b, w = _two_body(rng, top, m_b, m_w)
        quarks.append(b)
        if lep:
            flavour = rng.choice([11, 13, 15])
            sign = rng.choice([1, -1])
            l4, n4 = _two_body(rng, w, 0.0, 0.0)
            nu += n4
            if flavour == 15:  # tau -> l nu nu: the visible lepton keeps a random fraction
                frac = rng.uniform(0.2, 0.8)
                nu += (1 - frac) * l4
                l4 = frac * l4
                flavour = rng.choice([11, 13])
            leptons.append((int(sign * flavour), l4))
        else:
            q1, q2 = _two_body(rng, w, 0.0, 0.0)
            quarks += [q1, q2]
    return quarks, leptons, nu


def _fragment(rng: np.random.Generator, quarks: list[np.ndarray]):
    """Particles (class index, energy, unit direction) of the jets of the given quarks."""
    cls, energy, dirs = [], [], []
    for q in quarks:
        e_jet = float(q[0])
        axis = q[1:] / np.linalg.norm(q[1:])
        n = 1 + rng.poisson(JET_MULT_A + JET_MULT_B * math.log(max(e_jet, 1.0)))
        z = rng.dirichlet(np.full(n, 0.7))
        e = np.maximum(z * e_jet, 0.15)
        c = rng.choice(6, size=n, p=SPECIES_P)
        pt_rel = rng.exponential(0.35, n)
        theta = np.arctan2(pt_rel, e)
        azim = rng.uniform(-np.pi, np.pi, n)
        e1, e2 = _orthonormal(axis[None, :])
        d = np.cos(theta)[:, None] * axis[None, :] + np.sin(theta)[:, None] * (
            np.cos(azim)[:, None] * e1 + np.sin(azim)[:, None] * e2
        )
        cls.append(c)
        energy.append(e)
        dirs.append(d)
    return np.concatenate(cls), np.concatenate(energy), np.concatenate(dirs)


def generate_particles(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The visible final-state particles of one event plus its missing transverse momentum."""
    quarks, leptons, nu = _partons(rng)
    cls, energy, dirs = _fragment(rng, quarks)
    for pid, l4 in leptons:
        cls = np.append(cls, CLASS_PDG_IDS.index(abs(pid)))
        energy = np.append(energy, max(float(l4[0]), 0.5))
        dirs = np.vstack([dirs, l4[1:] / np.linalg.norm(l4[1:])])
    abs_pdg = np.asarray(CLASS_PDG_IDS)[cls]
    sign = rng.choice([1, -1], size=len(cls))
    sign[(abs_pdg == 22) | (abs_pdg == 130)] = 1
    pid = abs_pdg * sign
    facts = _pdg_facts()
    mass = np.array([facts[int(p)][0] for p in pid])
    charge = np.array([facts[int(p)][1] for p in pid])
    energy = np.maximum(energy, mass * 1.0001 + 0.01)
    p = np.sqrt(energy**2 - mass**2)
    mom = p[:, None] * dirs
    pt = np.hypot(mom[:, 0], mom[:, 1])
    keep = pt > 1e-3
    out = {
        "cls": cls[keep],
        "pid": pid[keep],
        "charge": charge[keep],
        "energy": energy[keep],
        "mom": mom[keep],
        "pt": pt[keep],
    }
    out["eta"] = np.arcsinh(out["mom"][:, 2] / out["pt"])
    out["phi"] = np.arctan2(out["mom"][:, 1], out["mom"][:, 0])
    out["genmet"] = float(np.hypot(nu[1], nu[2]))
    return out


# ============================================================================================
# Detector level

_HIT_COLS = 15


def _hits_array(n: int) -> np.ndarray:
    return np.zeros((n, _HIT_COLS), dtype=np.float64)


def _fill_geometry(
    h: np.ndarray, pos: np.ndarray, energy: np.ndarray, time_ns: np.ndarray, unit_scale: bool
) -> None:
    """Columns et, eta, sin_phi, cos_phi, energy, position, time from positions and energies.

    Tracker hits store (sin, cos) of phi multiplied by the common positive factor
    rho_T/|pos| = sin(theta) (as the real hit data do), calorimeter hits unit-normalised.
    """
    x, y, z = pos[:, 0], pos[:, 1], pos[:, 2]
    rt = np.hypot(x, y)
    r3 = np.sqrt(rt**2 + z**2)
    rt_safe = np.maximum(rt, 1e-6)
    h[:, 1] = energy * rt / np.maximum(r3, 1e-6)
    h[:, 2] = np.arcsinh(z / rt_safe)
    norm = rt_safe if unit_scale else np.maximum(r3, 1e-6)
    h[:, 3] = y / norm
    h[:, 4] = x / norm
    h[:, 5] = energy
    h[:, 6:9] = pos
    h[:, 9] = time_ns


def _tracker_hits(rng, parts: dict[str, np.ndarray], occ: float):
    """Helix crossings of charged particles with barrel layers and disks; hits, owner index."""
    charged = np.flatnonzero(parts["charge"] != 0)
    if len(charged) == 0:
        return _hits_array(0), np.zeros(0, dtype=np.int64)
    q = parts["charge"][charged][:, None]
    pt = parts["pt"][charged][:, None]
    phi0 = parts["phi"][charged][:, None]
    cot = (parts["mom"][charged, 2] / parts["pt"][charged])[:, None]
    beta = (np.linalg.norm(parts["mom"][charged], axis=1) / parts["energy"][charged])[:, None]
    radius = pt / (0.3 * B_FIELD) * 1000.0  # mm
    z0 = rng.normal(0.0, 0.02, (len(charged), 1))
    blocks = []
    # barrel layers [P, L]
    r_l = _BARREL[None, :, 2]
    ratio = r_l / (2 * radius)
    reach = ratio < 1.0
    alpha = np.arcsin(np.clip(ratio, 0, 1))
    s = 2 * radius * alpha
    z = z0 + s * cot
    ok = reach & (np.abs(z) < _BARREL[None, :, 3])
    pi, li = np.nonzero(ok)
    phi = phi0[pi, 0] - q[pi, 0] * alpha[pi, li] + rng.normal(0, 0.005 / r_l[0, li])
    pos = np.stack([r_l[0, li] * np.cos(phi), r_l[0, li] * np.sin(phi), z[pi, li]], axis=1)
    blocks.append(
        (pi, pos, _BARREL[li, 0], _BARREL[li, 1], np.zeros(len(li)), s[pi, li], z[pi, li])
    )
    # disks [P, D]
    zd = _DISKS[None, :, 2]
    s_d = (zd - z0) / np.where(np.abs(cot) < 1e-9, 1e-9, cot)
    turn = s_d / (2 * radius)
    r_d = 2 * radius * np.sin(np.clip(turn, 0, np.pi / 2))
    ok = (s_d > 0) & (turn < np.pi / 2) & (r_d >= _DISKS[None, :, 3]) & (r_d <= _DISKS[None, :, 4])
    pi, di = np.nonzero(ok)
    phi = phi0[pi, 0] - q[pi, 0] * turn[pi, di]
    rr = r_d[pi, di]
    pos = np.stack([rr * np.cos(phi), rr * np.sin(phi), zd[0, di]], axis=1)
    blocks.append(
        (pi, pos, _DISKS[di, 0], _DISKS[di, 1], _DISKS[di, 5], s_d[pi, di], zd[0, di] - z0[pi, 0])
    )
    owner = np.concatenate([b[0] for b in blocks])
    pos = np.concatenate([b[1] for b in blocks])
    system = np.concatenate([b[2] for b in blocks])
    layer = np.concatenate([b[3] for b in blocks])
    side = np.concatenate([b[4] for b in blocks])
    path = np.hypot(np.concatenate([b[5] for b in blocks]), np.concatenate([b[6] for b in blocks]))
    keep = rng.random(len(owner)) < TRACKER_EFFICIENCY * min(occ, 1.0)
    owner, pos, system, layer, side, path = (
        a[keep] for a in (owner, pos, system, layer, side, path)
    )
    edep = 8e-5 * (1.0 + rng.exponential(0.3, len(owner)))  # GeV, Landau-like tail
    t = path / (C_MM_PER_NS * beta[owner, 0]) + rng.normal(0, 0.05, len(owner))
    h = _hits_array(len(owner))
    _fill_geometry(h, pos, edep, t, unit_scale=False)
    h[:, 0] = 1
    h[:, 10] = SUBDET_TRACKER
    h[:, 11] = 0
    h[:, 12] = system
    h[:, 13] = side
    h[:, 14] = layer
    return h, charged[owner]


def _calo_entry(parts: dict[str, np.ndarray], idx: np.ndarray):
    """Unit shower axis and whether each particle enters the barrel (else an endcap)."""
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


def _calo_block(rng, owner, axis, barrel, layer, calo, energy, spread_mm, kind):
    n = len(owner)
    nl = ECAL_LAYERS if calo == "ecal" else HCAL_LAYERS
    frac = (layer + 0.5) / nl
    centre = _layer_position(axis[owner], barrel[owner], frac, calo)
    e1, e2 = _orthonormal(axis[owner])
    rad = rng.exponential(1.0, n) * spread_mm
    ang = rng.uniform(-np.pi, np.pi, n)
    pos = centre + (rad * np.cos(ang))[:, None] * e1 + (rad * np.sin(ang))[:, None] * e2
    cell = ECAL_CELL if calo == "ecal" else HCAL_CELL
    pos = np.round(pos / cell) * cell + cell / 2
    r3 = np.linalg.norm(pos, axis=1)
    t = r3 / C_MM_PER_NS + rng.exponential(0.3 if kind != 1 else 2.0, n)
    h = _hits_array(n)
    _fill_geometry(h, pos, energy, t, unit_scale=True)
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


def _share(rng, owner: np.ndarray, total: np.ndarray, shape: float = 0.6) -> np.ndarray:
    """Split ``total[owner]`` among each owner's hits with Gamma-distributed weights."""
    w = rng.gamma(shape, 1.0, len(owner))
    s = np.bincount(owner, weights=w, minlength=len(total))
    return total[owner] * w / np.maximum(s[owner], 1e-12)


def _calo_hits(rng, parts: dict[str, np.ndarray], occ: float):
    """Shower, MIP and background hits in ECAL, HCAL and muon system; hits and owner (-1: none)."""
    absid = np.abs(parts["pid"])
    idx = np.arange(len(absid))
    axis, barrel, reaches = _calo_entry(parts, idx)
    energy = parts["energy"]
    em = reaches & ((absid == 22) | (absid == 11))
    had = reaches & ((absid == 211) | (absid == 130))
    mu = reaches & (absid == 13)
    blocks, owners = [], []
    thin = min(occ, 1.0)

    # electromagnetic showers: longitudinal Gamma profile peaking near ln(E) in the ECAL
    n_em = np.where(em, rng.poisson(EM_HITS_PER_GEV * occ * energy**EM_POWER), 0)
    own = np.repeat(idx, n_em)
    if len(own):
        shape = 2.0 + 0.6 * np.log(np.maximum(energy[own], 0.1) / 0.01)
        layer = np.minimum(rng.gamma(shape, 1.6), ECAL_LAYERS - 1).astype(int)
        edep = energy * np.clip(1 + rng.normal(0, 0.15 / np.sqrt(energy)), 0.3, 2.0)
        e_hit = _share(rng, own, edep)
        blocks.append(_calo_block(rng, own, axis, barrel, layer, "ecal", e_hit, 9.0, 0))
        owners.append(own)

    # hadronic showers: start depth in interaction lengths ~ Exp(1); ECAL = 1 lambda, HCAL 5.5
    start = rng.exponential(1.0, len(idx))
    n_had = np.where(had, rng.poisson(HAD_HITS_PER_GEV * occ * energy**HAD_POWER), 0)
    own = np.repeat(idx, n_had)
    if len(own):
        depth = start[own] + rng.gamma(2.0, 0.7, len(own))  # lambda
        in_ecal = depth < 1.0
        edep = energy * np.clip(0.85 + rng.normal(0, 0.5 / np.sqrt(energy)), 0.1, 1.5)
        e_hit = _share(rng, own, edep)
        le = np.minimum((depth / 1.0 * ECAL_LAYERS), ECAL_LAYERS - 1).astype(int)
        lh = np.minimum(((depth - 1.0) / 5.5 * HCAL_LAYERS), HCAL_LAYERS - 1).astype(int)
        m = in_ecal
        if m.any():
            blocks.append(_calo_block(rng, own[m], axis, barrel, le[m], "ecal", e_hit[m], 25.0, 1))
            owners.append(own[m])
        m = ~in_ecal
        if m.any():
            blocks.append(
                _calo_block(
                    rng, own[m], axis, barrel, np.maximum(lh[m], 0), "hcal", e_hit[m], 60.0, 1
                )
            )
            owners.append(own[m])

    # MIP tracks: muons through everything, charged hadrons through the ECAL layers before their
    # shower starts; one hit per layer (thinned when occupancy < 1)
    mip_ecal_layers = np.where(
        mu,
        ECAL_LAYERS,
        np.where(had & (parts["charge"] != 0), np.minimum(start, 1.0) * ECAL_LAYERS, 0),
    ).astype(int)
    for calo, nl_of, e_mip in (
        ("ecal", mip_ecal_layers, 0.005),
        ("hcal", np.where(mu, HCAL_LAYERS, 0), 0.025),
    ):
        own = np.repeat(idx, nl_of)
        if not len(own):
            continue
        first = np.concatenate([[0], np.cumsum(nl_of)[:-1]])
        layer = np.arange(len(own)) - np.repeat(first, nl_of)
        keep = rng.random(len(own)) < thin
        own, layer = own[keep], layer[keep]
        e = e_mip * (1 + rng.exponential(0.3, len(own)))
        blocks.append(_calo_block(rng, own, axis, barrel, layer, calo, e, 2.0, 2))
        owners.append(own)
    # muon system: a few hits for muons above 3 GeV
    m_idx = idx[mu & (energy > 3.0)]
    if len(m_idx):
        own = np.repeat(m_idx, MUON_LAYERS)
        layer = np.tile(np.arange(MUON_LAYERS), len(m_idx))
        keep = rng.random(len(own)) < thin
        own, layer = own[keep], layer[keep]
        r_l = MUON_R[0] + (layer + 0.5) / MUON_LAYERS * (MUON_R[1] - MUON_R[0])
        sin_t = np.hypot(axis[own, 0], axis[own, 1])
        pos = (r_l / np.maximum(sin_t, 0.3))[:, None] * axis[own]
        pos = np.round(pos / MUON_CELL) * MUON_CELL
        h = _hits_array(len(own))
        _fill_geometry(
            h, pos, 0.002 * np.ones(len(own)), np.linalg.norm(pos, axis=1) / C_MM_PER_NS, True
        )
        h[:, 0] = 2
        h[:, 10] = SUBDET_MUON
        h[:, 11] = 2
        h[:, 12] = SYSTEM_MUON
        h[:, 14] = layer
        blocks.append(h)
        owners.append(own)

    # low-energy background (gamma gamma -> hadrons, pairs), mostly forward
    n_bkg = rng.poisson(BKG_CALO_MEDIAN * occ * math.exp(rng.normal(0, BKG_SIGMA)))
    if n_bkg:
        eta = rng.normal(0, 1.9, n_bkg)
        phi = rng.uniform(-np.pi, np.pi, n_bkg)
        theta = 2 * np.arctan(np.exp(-eta))
        ax = np.stack([np.sin(theta) * np.cos(phi), np.sin(theta) * np.sin(phi), np.cos(theta)], 1)
        cot = ax[:, 2] / np.maximum(np.hypot(ax[:, 0], ax[:, 1]), 1e-9)
        bar = np.abs(ECAL_R[0] * cot) < ECAL_HALF_Z
        hcal = rng.random(n_bkg) < 0.4
        own = np.arange(n_bkg)
        e = rng.exponential(0.004, n_bkg)
        for calo, m, nl, spread in (
            ("ecal", ~hcal, ECAL_LAYERS, 0.0),
            ("hcal", hcal, HCAL_LAYERS, 0.0),
        ):
            if m.any():
                layer = rng.integers(0, nl, m.sum())
                h = _calo_block(
                    rng, np.arange(m.sum()), ax[m], bar[m], layer, calo, e[m], spread, 3
                )
                blocks.append(h)
                owners.append(np.full(m.sum(), -1))
        del own
    if not blocks:
        return _hits_array(0), np.zeros(0, dtype=np.int64)
    return _merge_cells(np.concatenate(blocks), np.concatenate(owners))


def _merge_cells(h: np.ndarray, owner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def _tracker_background(rng, occ: float) -> np.ndarray:
    n = rng.poisson(BKG_TRACKER_MEDIAN * occ * math.exp(rng.normal(0, BKG_SIGMA)))
    h = _hits_array(n)
    if not n:
        return h
    in_vtx = rng.random(n) < 0.7
    li = np.where(in_vtx, rng.integers(0, 6, n), rng.integers(6, len(_BARREL), n))
    r = _BARREL[li, 2]
    z = rng.uniform(-1, 1, n) * _BARREL[li, 3]
    phi = rng.uniform(-np.pi, np.pi, n)
    pos = np.stack([r * np.cos(phi), r * np.sin(phi), z], 1)
    _fill_geometry(h, pos, 5e-5 * (1 + rng.exponential(0.5, n)), rng.uniform(-1, 5, n), False)
    h[:, 0] = 1
    h[:, 10] = SUBDET_TRACKER
    h[:, 12] = _BARREL[li, 0]
    h[:, 14] = _BARREL[li, 1]
    return h


# ============================================================================================
# Jets


def cluster_jets(p4: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ee_genkt (R=0.4, p=-1) jets of four-vectors (E, px, py, pz) [n, 4] above 5 GeV pT.

    Returns jets [J, 4] as (pt, eta, phi, energy), sorted by energy, and each input's jet index
    (1-based; 0 = in no jet).  Empty results when fastjet is not installed.
    """
    assign = np.zeros(len(p4), dtype=np.int64)
    fj = _fastjet()
    if fj is None or len(p4) == 0:
        return np.zeros((0, 4), np.float32), assign
    pjs = []
    for i, (e, px, py, pz) in enumerate(p4):
        pj = fj.PseudoJet(float(px), float(py), float(pz), float(e))
        pj.set_user_index(i)
        pjs.append(pj)
    cs = fj.ClusterSequence(pjs, _jet_definition())
    jets = fj.sorted_by_E(cs.inclusive_jets(JET_PTMIN))
    out = np.zeros((len(jets), 4), np.float32)
    for j, jet in enumerate(jets):
        out[j] = (jet.pt(), jet.eta(), jet.phi_std(), jet.E())
        for c in jet.constituents():
            assign[c.user_index()] = j + 1
    return out, assign


@functools.cache
def _fastjet():
    """The fastjet module, or None; its banner (printed by C++ on first use) is swallowed."""
    try:
        import fastjet
    except ImportError:
        return None
    import os
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            jd = fastjet.JetDefinition(fastjet.ee_genkt_algorithm, JET_R, -1.0)
            fastjet.ClusterSequence([fastjet.PseudoJet(1.0, 0.0, 0.0, 1.0)], jd).inclusive_jets(0.0)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    return fastjet


@functools.cache
def _jet_definition():
    fj = _fastjet()
    return fj.JetDefinition(fj.ee_genkt_algorithm, JET_R, -1.0)


# ============================================================================================
# One event -> both data sets


def simulate_event(
    rng: np.random.Generator, occupancy_scale: float = 1.0
) -> dict[str, dict[str, np.ndarray]]:
    """Simulate one event; return the ``hits`` and ``pf`` examples (TFDS feature dicts)."""
    parts = generate_particles(rng)
    n_part = len(parts["pid"])
    trk, trk_owner = _tracker_hits(rng, parts, occupancy_scale)
    bkg_t = _tracker_background(rng, occupancy_scale)
    cal, cal_owner = _calo_hits(rng, parts, occupancy_scale)
    # order: tracker hits (by system, layer), then calorimeter hits (by subdetector, system, layer)
    trk_all = np.concatenate([trk, bkg_t])
    trk_own = np.concatenate([trk_owner, np.full(len(bkg_t), -1)])
    o = np.lexsort((trk_all[:, 14], trk_all[:, 12]))
    trk_all, trk_own = trk_all[o], trk_own[o]
    o = np.lexsort((cal[:, 14], cal[:, 12], cal[:, 10]))
    cal, cal_owner = cal[o], cal_owner[o]
    X = np.concatenate([trk_all, cal])
    owner = np.concatenate([trk_own, cal_owner]).astype(np.int64)
    n_hits = len(X)

    # target particles: particles with at least one hit, numbered 1..P in generator order
    n_trk = np.bincount(trk_own[trk_own >= 0], minlength=n_part)
    n_cal = np.bincount(cal_owner[cal_owner >= 0], minlength=n_part)
    has_hit = (n_trk + n_cal) > 0
    number = np.zeros(n_part, dtype=np.int64)
    number[has_hit] = np.arange(1, has_hit.sum() + 1)

    p4 = np.concatenate([parts["energy"][:, None], parts["mom"]], axis=1)
    genjets, _ = cluster_jets(p4)
    targetjets, tj_assign_t = cluster_jets(p4[has_hit])
    jet_idx = np.zeros(n_part, dtype=np.int64)
    jet_idx[has_hit] = tj_assign_t

    has_track = n_trk >= MIN_TRACK_HITS
    props = np.zeros((n_part, Y_WIDTH))
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
    props[:, 10] = has_track
    props[:, 11] = n_cal > 0
    props[:, 12] = jet_idx
    props[:, 13] = number

    # representative hit: innermost tracker hit of a charged particle (hits are sorted from the
    # inside out), otherwise its most energetic calorimeter hit
    ytarget = np.zeros((n_hits, Y_WIDTH))
    ok = owner >= 0
    ytarget[ok, 13] = number[owner[ok]]
    rep = np.full(n_part, -1, dtype=np.int64)
    hit_idx = np.arange(n_hits)
    is_trk = np.zeros(n_hits, bool)
    is_trk[: len(trk_all)] = True
    # innermost: smallest transverse radius among the particle's tracker hits
    rt = np.hypot(X[:, 6], X[:, 7])
    sel = ok & is_trk
    if sel.any():
        order = np.lexsort((rt[sel], owner[sel]))
        ow, hi = owner[sel][order], hit_idx[sel][order]
        first = np.r_[True, ow[1:] != ow[:-1]]
        rep[ow[first]] = hi[first]
    sel = ok & ~is_trk
    if sel.any():
        order = np.lexsort((-X[sel, 5], owner[sel]))
        ow, hi = owner[sel][order], hit_idx[sel][order]
        first = np.r_[True, ow[1:] != ow[:-1]]
        need = rep[ow[first]] < 0
        rep[ow[first][need]] = hi[first][need]
    reps = np.flatnonzero(rep >= 0)
    ytarget[rep[reps]] = props[reps]

    genmet = np.float32(parts["genmet"])
    hits_ex = {
        "X": X.astype(np.float32),
        "ytarget": ytarget.astype(np.float32),
        "ycand": np.zeros((n_hits, Y_WIDTH), np.float32),
        "genmet": genmet,
        "genjets": genjets,
        "targetjets": targetjets,
    }
    pf_ex = _pf_elements(rng, parts, props, X, owner, is_trk, n_trk, has_track)
    pf_ex.update(genmet=genmet, genjets=genjets, targetjets=targetjets)
    return {"hits": hits_ex, "pf": pf_ex}


def _pf_elements(rng, parts, props, X, owner, is_trk, n_trk, has_track) -> dict[str, np.ndarray]:
    """Tracks (charged particles with >= MIN_TRACK_HITS tracker hits) then clusters (calorimeter
    hits grouped by particle); element-wise targets: a particle's properties go on its track if
    it has one, else on its cluster; its other elements carry only particle_number."""
    n_part = len(parts["pid"])
    nx = X_WIDTH[PF_NAME]
    trk_ids = np.flatnonzero(has_track)
    tracks = np.zeros((len(trk_ids), nx))
    if len(trk_ids):
        pt = parts["pt"][trk_ids] * (1 + rng.normal(0, 2e-5 * parts["pt"][trk_ids] + 1e-3))
        eta = parts["eta"][trk_ids] + rng.normal(0, 1e-4, len(trk_ids))
        phi = parts["phi"][trk_ids] + rng.normal(0, 1e-4, len(trk_ids))
        q = parts["charge"][trk_ids]
        nh = n_trk[trk_ids]
        sel = (owner >= 0) & is_trk
        rt = np.hypot(X[sel, 6], X[sel, 7])
        rmin = np.full(n_part, np.inf)
        np.minimum.at(rmin, owner[sel], rt)
        dedx_sum = np.bincount(owner[sel], weights=X[sel, 5], minlength=n_part)
        tracks[:, 0] = 1
        tracks[:, 1] = pt
        tracks[:, 2] = eta
        tracks[:, 3] = np.sin(phi)
        tracks[:, 4] = np.cos(phi)
        tracks[:, 5] = pt * np.cosh(eta)
        ndf = 2 * nh - 5
        tracks[:, 6] = rng.chisquare(np.maximum(ndf, 1))
        tracks[:, 7] = ndf
        tracks[:, 8] = dedx_sum[trk_ids] / nh
        tracks[:, 9] = 0.1 * tracks[:, 8]
        tracks[:, 10] = rmin[trk_ids]
        tracks[:, 11] = np.sinh(eta)
        tracks[:, 12] = rng.normal(0, 0.01, len(trk_ids))
        tracks[:, 13] = q * 0.3 * B_FIELD / pt * 1e-3
        tracks[:, 14] = rng.normal(0, 0.02, len(trk_ids))
        tracks[:, 15] = rng.normal(0, 0.03, len(trk_ids))
    sel = (owner >= 0) & ~is_trk
    ow, Xc = owner[sel], X[sel]
    cl_ids = np.unique(ow)
    clusters = np.zeros((len(cl_ids), nx))
    if len(cl_ids):
        w = Xc[:, 5]
        esum = np.bincount(ow, weights=w, minlength=n_part)
        cnt = np.bincount(ow, minlength=n_part)
        mean = np.stack(
            [np.bincount(ow, weights=w * Xc[:, 6 + k], minlength=n_part) for k in range(3)], 1
        )
        mean /= np.maximum(esum, 1e-12)[:, None]
        var = (
            np.stack(
                [
                    np.bincount(ow, weights=w * (Xc[:, 6 + k] - mean[ow, k]) ** 2, minlength=n_part)
                    for k in range(3)
                ],
                1,
            )
            / np.maximum(esum, 1e-12)[:, None]
        )
        e_sub = [np.bincount(ow, weights=w * (Xc[:, 10] == s), minlength=n_part) for s in (1, 2, 3)]
        m = mean[cl_ids]
        rt = np.hypot(m[:, 0], m[:, 1])
        r3 = np.linalg.norm(m, axis=1)
        e = esum[cl_ids]
        clusters[:, 0] = 2
        clusters[:, 1] = e * rt / np.maximum(r3, 1e-6)
        clusters[:, 2] = np.arcsinh(m[:, 2] / np.maximum(rt, 1e-6))
        clusters[:, 3] = m[:, 1] / np.maximum(rt, 1e-6)
        clusters[:, 4] = m[:, 0] / np.maximum(rt, 1e-6)
        clusters[:, 5] = e
        clusters[:, 6:9] = m
        clusters[:, 9] = np.arctan2(rt, m[:, 2])
        clusters[:, 10] = e_sub[0][cl_ids]
        clusters[:, 11] = e_sub[1][cl_ids]
        clusters[:, 12] = e_sub[2][cl_ids]
        clusters[:, 13] = cnt[cl_ids]
        clusters[:, 14:17] = np.sqrt(var[cl_ids])
    Xpf = np.concatenate([tracks, clusters]).astype(np.float32)
    y = np.zeros((len(Xpf), Y_WIDTH))
    y[: len(trk_ids)] = props[trk_ids]
    cl_props = np.zeros((len(cl_ids), Y_WIDTH))
    cl_props[:, 13] = props[cl_ids, 13]
    full = ~has_track[cl_ids]
    cl_props[full] = props[cl_ids[full]]
    y[len(trk_ids) :] = cl_props
    return {
        "X": Xpf,
        "ytarget": y.astype(np.float32),
        "ycand": np.zeros((len(Xpf), Y_WIDTH), np.float32),
    }


# ============================================================================================
# Writing both data sets


def _event_rng(seed: int, config: str, split: str, index: int) -> np.random.Generator:
    return np.random.default_rng(
        np.random.SeedSequence([seed, int(config), SPLIT_CODE[split], index])
    )


SPLIT_CODE = {"train": 0, "test": 1}


def _serialized_event(job: tuple[int, str, str, int, float]) -> tuple[bytes, bytes]:
    seed, config, split, index, occ = job
    ev = simulate_event(_event_rng(seed, config, split, index), occ)
    return (
        features_dict(HITS_NAME).serialize_example(ev["hits"]),
        features_dict(PF_NAME).serialize_example(ev["pf"]),
    )


def generate_datasets(
    data_dir: str | Path,
    events_train: int,
    events_test: int,
    seed: int,
    configs: Sequence[str] = ("1",),
    occupancy_scale: float = 1.0,
    progress: bool = True,
    workers: int | None = None,
) -> dict[str, Any]:
    """Write ``cld_edm_ttbar_hits`` and ``cld_edm_ttbar_pf`` (version 3.2.1) for ``configs``.

    Each event is simulated once (its random stream depends only on seed, config, split and
    index) and written to both data sets.  ``workers`` processes (default: up to 2) simulate and
    serialise events; the results do not depend on it.  Returns a summary with the written paths, the event
    counts and the seconds spent.
    """
    from tqdm.auto import tqdm

    for what, value in (("events_train", events_train), ("events_test", events_test)):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise DataError(
                f"{what}={value!r} must be a positive integer number of events; give e.g. 100"
            )
    if not occupancy_scale > 0 or not math.isfinite(occupancy_scale):
        raise DataError(
            f"occupancy_scale={occupancy_scale!r} must be a positive finite number "
            "(1.0 = the calibrated CLD-like occupancy; tests use ~0.03)"
        )
    configs = [str(c) for c in configs]
    bad = [c for c in configs if c not in CONFIG_NAMES]
    if bad or not configs:
        raise DataError(
            f"configs={configs!r}: allowed builder configs are {list(CONFIG_NAMES)}; pass e.g. --configs 1 2"
        )
    data_dir = Path(data_dir)
    for name in (HITS_NAME, PF_NAME):
        for c in configs:
            if (data_dir / name / c / VERSION / "dataset_info.json").exists():
                raise DataError(
                    f"{data_dir / name / c / VERSION} already exists; remove it or choose another "
                    "--data-dir (data sets are never silently overwritten)"
                )
    fastjet_ok = _fastjet() is not None
    metadata = {
        "synthetic": True,
        "generator": "heptstudy.data.generate",
        "generator_version": GENERATOR_VERSION,
        "description": "synthetic CLD-like e+e- -> ttbar events at 365 GeV (not real simulation)",
        "seed": int(seed),
        "occupancy_scale": float(occupancy_scale),
        "events_train": int(events_train),
        "events_test": int(events_test),
        "sqrt_s_gev": SQRT_S,
        "b_field_t": B_FIELD,
        "jets": "fastjet ee_genkt R=0.4 p=-1, pT > 5 GeV, (pt, eta, phi, energy)"
        if fastjet_ok
        else "empty: fastjet is not installed",
        "calibration": {
            "em_hits_per_gev": EM_HITS_PER_GEV,
            "had_hits_per_gev": HAD_HITS_PER_GEV,
            "bkg_tracker_median": BKG_TRACKER_MEDIAN,
            "bkg_calo_median": BKG_CALO_MEDIAN,
        },
    }
    counts = {"train": int(events_train), "test": int(events_test)}
    total = len(configs) * sum(counts.values())
    bar = tqdm(total=total, desc="generating events", unit="ev", disable=not progress)
    t0 = time.perf_counter()
    written = {HITS_NAME: [], PF_NAME: []}
    if workers is None:
        workers = min(2, os.cpu_count() or 1)
    pool = None
    if workers > 1 and total > 8:
        import multiprocessing

        pool = multiprocessing.get_context("fork").Pool(workers)
    try:
        for config in configs:
            md = dict(metadata, config=config)
            writers = {
                "hits": ArrayRecordDatasetWriter(
                    data_dir,
                    HITS_NAME,
                    config,
                    counts,
                    md,
                    "Synthetic CLD-like ttbar events, one row per tracker/calorimeter hit.",
                ),
                "pf": ArrayRecordDatasetWriter(
                    data_dir,
                    PF_NAME,
                    config,
                    counts,
                    md,
                    "Synthetic CLD-like ttbar events, one row per track/calorimeter cluster.",
                ),
            }
            for split, n in counts.items():
                jobs = [(seed, config, split, i, occupancy_scale) for i in range(n)]
                results = (
                    pool.imap(_serialized_event, jobs, chunksize=4)
                    if pool
                    else map(_serialized_event, jobs)
                )
                for hits_bytes, pf_bytes in results:
                    writers["hits"].add_serialized(split, hits_bytes)
                    writers["pf"].add_serialized(split, pf_bytes)
                    bar.update(1)
            written[HITS_NAME].append(str(writers["hits"].close()))
            written[PF_NAME].append(str(writers["pf"].close()))
    finally:
        bar.close()
        if pool is not None:
            pool.close()
            pool.join()
    return {
        "data_dir": str(data_dir),
        "paths": written,
        "configs": configs,
        "events": counts,
        "seconds": time.perf_counter() - t0,
        "metadata": metadata,
    }
