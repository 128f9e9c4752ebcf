"""Writing both data sets: per-event random streams, the worker pool, ``generate_datasets``."""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from heptstudy.data.generate import detector as det
from heptstudy.data.generate.event import fastjet_module, simulate_event
from heptstudy.data.generate.particles import SQRT_S
from heptstudy.data.schema import HIT_FEATURES, TARGET_COLUMNS
from heptstudy.data.tfds import (
    CONFIG_NAMES,
    DATA_OPTIONS,
    HITS_NAME,
    PF_NAME,
    VERSION,
    ArrayRecordDatasetWriter,
    features_dict,
)
from heptstudy.errors import DataError, os_error_advice
from heptstudy.locks import holding
from heptstudy.units import refuse_above_memory

GENERATOR_VERSION = "1"
SPLIT_CODE = {"train": 0, "test": 1}
DESCRIPTIONS = {  # in the order _serialized_event returns the examples
    HITS_NAME: "Synthetic CLD-like ttbar events, one row per tracker/calorimeter hit.",
    PF_NAME: "Synthetic CLD-like ttbar events, one row per track/calorimeter cluster.",
}


def _event_rng(seed: int, config: str, split: str, index: int) -> np.random.Generator:
    """The random stream of one event: depends only on seed, config, split and index."""
    return np.random.default_rng(
        np.random.SeedSequence([seed, int(config), SPLIT_CODE[split], index])
    )


def _serialized_event(job: tuple[int, str, str, int, float]) -> tuple[bytes, bytes]:
    seed, config, split, index, occ = job
    ev = simulate_event(_event_rng(seed, config, split, index), occ)
    return (
        features_dict(HITS_NAME).serialize_example(ev["hits"]),
        features_dict(PF_NAME).serialize_example(ev["pf"]),
    )


def _check_arguments(data_dir, configs, occupancy_scale) -> None:
    # events_train/events_test: the CLI takes only whole numbers from 1
    if not occupancy_scale > 0 or not math.isfinite(occupancy_scale):
        raise DataError(
            f"occupancy_scale={occupancy_scale!r} must be a positive finite number "
            "(1.0 = the calibrated CLD-like occupancy; tests use ~0.03)"
        )
    if not configs or any(c not in CONFIG_NAMES for c in configs):
        raise DataError(
            f"configs={configs!r}: allowed builder configs are {list(CONFIG_NAMES)}; pass e.g. --configs 1 2"
        )
    # else both writers of the config would make the same folder, after simulating its events
    DATA_OPTIONS.refuse_repeated(configs)
    for name in (HITS_NAME, PF_NAME):
        for c in configs:
            if (data_dir / name / c / VERSION).exists():
                raise DataError(
                    f"{data_dir / name / c / VERSION} already exists; remove it or choose another "
                    "--data-dir (data sets are never silently overwritten)"
                )


def _check_event_size(occupancy_scale: float, workers: int | None) -> None:
    """Refuse an occupancy whose median event alone cannot fit in memory, before simulating."""
    # a lower bound: a median event's background hits, float32 rows of X and two target tables,
    # one event in flight per worker
    hits = occupancy_scale * (det.BKG_TRACKER_MEDIAN + det.BKG_CALO_MEDIAN)
    row = 4 * (len(HIT_FEATURES) + 2 * len(TARGET_COLUMNS))
    refuse_above_memory(
        int(hits * row * (workers or 1)),
        f"--occupancy-scale {occupancy_scale:g} (a median event has more than {hits:,.0f} hits)",
        "Lower --occupancy-scale (1 is the calibrated CLD-like occupancy)",
    )


def _metadata(seed: int, occupancy_scale: float, events_train: int, events_test: int) -> dict:
    return {
        "synthetic": True,
        "generator": "heptstudy.data.generate",
        "generator_version": GENERATOR_VERSION,
        "description": "synthetic CLD-like e+e- -> ttbar events at 365 GeV (not real simulation)",
        "seed": int(seed),
        "occupancy_scale": float(occupancy_scale),
        "events_train": int(events_train),
        "events_test": int(events_test),
        "sqrt_s_gev": SQRT_S,
        "b_field_t": det.B_FIELD,
        "jets": "fastjet ee_genkt R=0.4 p=-1, pT > 5 GeV, (pt, eta, phi, energy)"
        if fastjet_module() is not None
        else "empty: fastjet is not installed",
        "calibration": {
            "em_hits_per_gev": det.EM_HITS_PER_GEV,
            "had_hits_per_gev": det.HAD_HITS_PER_GEV,
            "bkg_tracker_median": det.BKG_TRACKER_MEDIAN,
            "bkg_calo_median": det.BKG_CALO_MEDIAN,
        },
    }


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
    """Write both data sets for ``configs``; the result does not depend on ``workers``."""
    configs = [str(c) for c in configs]
    data_dir = Path(data_dir)
    _check_arguments(data_dir, configs, occupancy_scale)
    _check_event_size(occupancy_scale, workers)
    # one generation at a time in a data directory: a second one's clean-up would remove the
    # first one's unfinished data set; checked again under the lock, which the first may hold
    with holding(data_dir, "data directory (--data-dir)"):
        _check_arguments(data_dir, configs, occupancy_scale)
        metadata = _metadata(seed, occupancy_scale, events_train, events_test)
        counts = {"train": int(events_train), "test": int(events_test)}
        t0 = time.perf_counter()
        _write_datasets(
            data_dir, configs, counts, metadata, seed, occupancy_scale, progress, workers
        )
        return {
            "data_dir": str(data_dir),
            "configs": configs,
            "events": counts,
            "seconds": time.perf_counter() - t0,
            "metadata": metadata,
        }


def _worker_pool(workers: int | None, events: int):
    """A pool of ``workers`` processes (default: up to 2), or None where one process will do."""
    if workers is None:
        workers = min(2, os.cpu_count() or 1)
    if workers <= 1 or events <= 8:
        return None
    import multiprocessing

    # Ctrl-C reaches the workers too: the parent alone answers it, once
    return multiprocessing.get_context("fork").Pool(
        workers, initializer=signal.signal, initargs=(signal.SIGINT, signal.SIG_IGN)
    )


def _write_datasets(data_dir, configs, counts, metadata, seed, occupancy_scale, progress, workers):
    """Every config's two data sets, written event by event and put in place together."""
    from tqdm.auto import tqdm

    total = len(configs) * sum(counts.values())
    bar = tqdm(total=total, desc="generating events", unit="ev", disable=not progress)
    pool = _worker_pool(workers, total)
    # published only when all are finished: a failure leaves none, so a rerun simply works
    finished: list[ArrayRecordDatasetWriter] = []
    try:
        for config in configs:
            md = dict(metadata, config=config)
            writers = [
                ArrayRecordDatasetWriter(data_dir, name, config, counts, md, text)
                for name, text in DESCRIPTIONS.items()
            ]
            finished += writers
            for split, n in counts.items():
                jobs = [(seed, config, split, i, occupancy_scale) for i in range(n)]
                results = (
                    pool.imap(_serialized_event, jobs, chunksize=4)
                    if pool
                    else map(_serialized_event, jobs)
                )
                for examples in results:
                    for writer, data in zip(writers, examples, strict=True):
                        writer.add_serialized(split, data)
                    bar.update(1)
            for writer in writers:
                writer.finish()
        for writer in finished:
            writer.publish()
    except BaseException as exc:
        if pool is not None:  # its queued events are no longer wanted
            pool.terminate()
        for writer in finished:
            writer.discard()
        if isinstance(exc, OSError):
            raise DataError(
                f"writing the data sets to {str(data_dir)!r} failed: {exc.strerror or exc}"
                f"{f' ({exc.filename})' if exc.filename else ''}; none of them was put in place "
                f"and nothing is left half-written. {os_error_advice(exc)}, and run the same "
                "command again"
            ) from None
        raise
    finally:
        bar.close()
        if pool is not None:
            pool.close()
            pool.join()
