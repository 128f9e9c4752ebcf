"""The particle-level event: tt̄ decay mode, top -> b W, W -> q q' or l nu with two-body
kinematics; quark jets fragment into particles of the five target classes with multiplicity
growing with log(E) and Dirichlet energy sharing; masses and charges from ``particle``."""

from __future__ import annotations

import functools
import math

import numpy as np

from heptstudy.data.schema import CLASS_PDG_IDS

SQRT_S = 365.0  # GeV
JET_MULT_A, JET_MULT_B = 2.0, 3.4  # particles per quark jet ~ 1 + Poisson(a + b ln E)
SPECIES_P = np.array([0.0, 0.50, 0.11, 0.36, 0.02, 0.01])  # over CLASS_PDG_IDS


def boost(p4: np.ndarray, beta: np.ndarray) -> np.ndarray:
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


def random_dir(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` isotropic unit vectors [n, 3]."""
    cos = rng.uniform(-1, 1, n)
    phi = rng.uniform(-np.pi, np.pi, n)
    sin = np.sqrt(1 - cos**2)
    return np.stack([sin * np.cos(phi), sin * np.sin(phi), cos], axis=-1)


def two_body(rng, p4_parent: np.ndarray, m1: float, m2: float) -> tuple[np.ndarray, np.ndarray]:
    """Isotropic decay (in the rest frame) of ``p4_parent`` into masses ``m1`` and ``m2``."""
    m = math.sqrt(max(p4_parent[0] ** 2 - p4_parent[1:] @ p4_parent[1:], (m1 + m2) ** 2 + 1e-9))
    pstar = math.sqrt(max((m**2 - (m1 + m2) ** 2) * (m**2 - (m1 - m2) ** 2), 0.0)) / (2 * m)
    d = random_dir(rng, 1)[0]
    a = np.concatenate([[math.hypot(pstar, m1)], pstar * d])
    b = np.concatenate([[math.hypot(pstar, m2)], -pstar * d])
    beta = p4_parent[1:] / p4_parent[0]
    return boost(a, beta), boost(b, beta)


def orthonormal(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two unit vectors perpendicular to each row of unit vectors ``u`` [n, 3]."""
    helper = np.where(np.abs(u[:, 2:3]) < 0.9, [[0.0, 0.0, 1.0]], [[1.0, 0.0, 0.0]])
    e1 = np.cross(u, helper)
    e1 /= np.linalg.norm(e1, axis=1, keepdims=True)
    e2 = np.cross(u, e1)
    return e1, e2


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


def _partons(
    rng: np.random.Generator,
) -> tuple[list[np.ndarray], list[tuple[int, np.ndarray]], np.ndarray]:
    """Quark four-vectors, isolated leptons (pid, p4) and the summed neutrino four-vector."""
    m_t, m_w, m_b = 172.5, 80.4, 4.8
    e_top = SQRT_S / 2
    p_top = math.sqrt(e_top**2 - m_t**2)
    d = random_dir(rng, 1)[0]
    tops = [np.concatenate([[e_top], p_top * d]), np.concatenate([[e_top], -p_top * d])]
    mode = rng.choice(3, p=[0.457, 0.438, 0.105])  # number of leptonic W: 0, 1, 2
    leptonic = [False, False] if mode == 0 else [True, True] if mode == 2 else [True, False]
    if mode == 1:
        rng.shuffle(leptonic)
    quarks, leptons, nu = [], [], np.zeros(4)
    for top, lep in zip(tops, leptonic, strict=True):
        b, w = two_body(rng, top, m_b, m_w)
        quarks.append(b)
        if lep:
            flavour = rng.choice([11, 13, 15])
            sign = rng.choice([1, -1])
            l4, n4 = two_body(rng, w, 0.0, 0.0)
            nu += n4
            if flavour == 15:  # tau -> l nu nu: the visible lepton keeps a random fraction
                frac = rng.uniform(0.2, 0.8)
                nu += (1 - frac) * l4
                l4 = frac * l4
                flavour = rng.choice([11, 13])
            leptons.append((int(sign * flavour), l4))
        else:
            q1, q2 = two_body(rng, w, 0.0, 0.0)
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
        e1, e2 = orthonormal(axis[None, :])
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
