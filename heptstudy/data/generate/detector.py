"""The synthetic CLD-like detector: geometry (mm), subdetector and system codes, the hit row
(``X``, columns in ``schema``) and hit-count calibration: at ``occupancy_scale=1`` the median
event has ~900 tracker and ~8,500 calorimeter hits (CLIC ttbar, 380 GeV), a tail past 13,000."""

from __future__ import annotations

import numpy as np

B_FIELD = 2.0  # tesla
C_MM_PER_NS = 299.792458

# --- tracker: (system, layer, radius, half length) and (system, z, rmin, rmax)
BARREL = np.array(
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


DISKS = _disk_table()  # columns: system, layer, z, rmin, rmax, side

# --- calorimeters and muon system
ECAL_R = (2150.0, 2352.0)
ECAL_HALF_Z = 2210.0
ECAL_Z = (2307.0, 2509.0)
ECAL_LAYERS = 40
HCAL_R = (2400.0, 3566.0)
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
TRACKER_EFFICIENCY = 0.97


def hits_array(n: int) -> np.ndarray:
    """``n`` empty hit rows (the 15 columns of ``schema.HIT_FEATURES``)."""
    return np.zeros((n, 15), dtype=np.float64)


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
