"""Blind predictions of a GPU study: the estimate of every memory run of a matrix, made on a
laptop before any GPU measures that code, with the fingerprint of the code it was made from.

For each memory run the run's own request is resolved (platform, batch, checkpointing,
overrides), the bench's events picked as the bench picks them, each step run as the
target-faithful fake step (:func:`heptstudy.estimate.fake_step.estimate_step` with the
platform's device as target) and the whole bench process replayed through the caching-allocator
simulator: allocated and reserved, native and with expandable segments, maximum over the
counted steps, as the bench reports them.

Not predicted (and said so in the file): ``checkpointing: auto`` runs (auto chooses a plan per
step from its own calibration, on the GPU, against the GPU's budget), parity runs (no memory
figure). :func:`stale_parts` tells whether the file is still of the running code.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch
import yaml

from heptstudy.paths import base_dir, resolve_in_repo
from heptstudy.units import MIB

SCHEMA = "heptstudy.blind_predictions/1"
PREDICTIONS = "experiments/gpu_blind_predictions/predictions.json"
#: The data the GPU session carries (scripts/gpu/README.md): generated with this seed and counts.
DATA = {"events_train": 144, "events_test": 8, "seed": 20261014}
#: The parts whose change makes the predictions stale (the test enforces them).
ENFORCED_PARTS = ("model", "step")
REGENERATE = (
    "heptstudy data generate --data-dir /tmp/gpu-tfds --events-train 144 --events-test 8 "
    "--seed 20261014 && heptstudy study predict --matrix configs/study/gpu.yaml "
    "--data-dir /tmp/gpu-tfds"
)


def _sha256(path: Path) -> str:
    """Of the YAML's content, not its bytes: a comment (a profile's note on a prediction, say)
    changes no prediction."""
    content = yaml.safe_load(path.read_text())
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it is inside it (committed files name no
    machine's folders)."""
    try:
        return str(Path(path).resolve().relative_to(base_dir().resolve()))
    except ValueError:
        return str(path)


def fingerprint(matrix_path: Path, platform_files: list[Path]) -> dict:
    """The code, configuration and PyTorch the predictions are of."""
    from heptstudy import fingerprint as code_fingerprint

    files = sorted(set(platform_files))
    return {
        "code": code_fingerprint.part_hashes(("model", "step", "estimate")),
        "matrix": {"path": _shown(matrix_path), "sha256": _sha256(matrix_path)},
        "platforms": {_shown(f): _sha256(f) for f in files},
        "torch": torch.__version__,
    }


def stale_parts(doc: dict, matrix_path: Path) -> list[str]:
    """What changed since ``doc`` was made (empty: it is the running code's)."""
    from heptstudy import fingerprint as code_fingerprint

    fp = doc.get("fingerprint") or {}
    now = code_fingerprint.part_hashes(ENFORCED_PARTS)
    out = [f"{p} code" for p in ENFORCED_PARTS if (fp.get("code") or {}).get(p) != now[p]]
    if (fp.get("matrix") or {}).get("sha256") != _sha256(matrix_path):
        out.append(f"the matrix {matrix_path}")
    for name, sha in (fp.get("platforms") or {}).items():
        path = resolve_in_repo(name)
        if not path.is_file() or _sha256(path) != sha:
            out.append(f"the platform profile {name}")
    return out


def predict_run(config, profile, *, batch_size: int, warmup: int, steps: int, passes: str):
    """The blind prediction of one memory run of ``config`` on ``profile`` (None: the CPU):
    the bench's events, every step estimated, the bench process replayed."""
    from heptstudy.data import load_events
    from heptstudy.data.batching import event_indices
    from heptstudy.estimate.bench_process import simulate_bench_process
    from heptstudy.estimate.fake_step import DEFAULT_TORCH_VERSION, estimate_step

    target = profile.device if profile is not None else "cpu"
    version = getattr(profile, "torch_version", None) or DEFAULT_TORCH_VERSION
    indices = event_indices(config, batch_size, warmup + steps)
    started = time.perf_counter()
    traces, tracked, calls = [], [], {}
    for idx in indices:
        est = estimate_step(
            config,
            load_events(config, idx, "train"),
            target=target,
            torch_version=version,
            record_trace=True,
        )
        traces.append(est.trace)
        tracked.append(est.peak_allocated_bytes / MIB)
        calls = {"stand_ins": est.stand_in_calls, "scratch": est.scratch_ops}
    sim = simulate_bench_process(traces, warmup=warmup, passes=passes)
    return {
        "batch_size": batch_size,
        "platform": profile.name if profile is not None else None,
        "target": target,
        "torch_version": version,
        "steps": steps,
        "warmup": warmup,
        "event_indices": indices,
        "allocated_mib": sim.max_allocated("native") / MIB,
        "reserved_mib": sim.max_reserved("native") / MIB,
        "expandable_allocated_mib": sim.max_allocated("expandable") / MIB,
        "expandable_reserved_mib": sim.max_reserved("expandable") / MIB,
        "tracked_peak_mib": max(tracked[warmup:] or tracked),
        "per_step": [
            {
                "step": i,
                "allocated_mib": n.peak_allocated_mib,
                "reserved_mib": n.peak_reserved_mib,
                "expandable_reserved_mib": e.peak_reserved_mib,
            }
            for i, (n, e) in enumerate(zip(sim.native, sim.expandable, strict=True))
        ],
        "hits_of_the_last_step": calls,
        "seconds": time.perf_counter() - started,
    }
