"""Four-vector helpers: Lorentz boosts, isotropic directions, two-body decays, orthonormal
frames."""

from __future__ import annotations

import math

import numpy as np


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
