"""The hit row (``X`` of ``cld_edm_ttbar_hits``, columns in ``schema``) from positions, energies."""

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
