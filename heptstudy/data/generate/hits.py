"""The hit row (the ``X`` features of ``cld_edm_ttbar_hits``) built from positions and energies.

Columns: 0 type (1 tracker, 2 calorimeter), 1 et, 2 eta, 3 sin_phi, 4 cos_phi, 5 energy,
6-8 position, 9 time, 10 subdetector, 11 calorimeter type, 12 system, 13 side, 14 layer.
"""

from __future__ import annotations

import numpy as np

HIT_COLS = 15


def hits_array(n: int) -> np.ndarray:
    """``n`` empty hit rows."""
    return np.zeros((n, HIT_COLS), dtype=np.float64)


def fill_geometry(
    h: np.ndarray, pos: np.ndarray, energy: np.ndarray, time_ns: np.ndarray, unit_scale: bool
) -> None:
    """Columns 1-9 from positions and energies. Tracker hits store (sin, cos) of phi times
    rho_T/|pos| = sin(theta) (as the real hit data do), calorimeter hits unit-normalised."""
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
