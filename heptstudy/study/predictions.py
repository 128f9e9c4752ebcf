"""Blind predictions of a GPU study: the estimate of every memory run of a matrix, made on a
laptop before any GPU measures that code, with the fingerprint of the code it was made from.

For each memory run the run's own request is resolved (platform, batch, checkpointing,
overrides), the bench's events picked as the bench picks them, each step run as the
target-faithful fake step (:func:`heptstudy.measure.estimate.fake_step.estimate_step` with the
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

from heptstudy.atomic import atomic_write_text
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
    "--seed 20261014 && python -m heptstudy.study.predictions configs/study/gpu.yaml "
    "--data-dir /tmp/gpu-tfds --out experiments/gpu_blind_predictions/predictions.json"
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


def fingerprint(matrix_path: Path, platforms: list[str]) -> dict:
    """The code, configuration and PyTorch the predictions are of."""
    from heptstudy.measure.estimate import code_fingerprint
    from heptstudy.measure.request import find_platform

    files = sorted({Path(find_platform(p)) for p in platforms})
    return {
        "code": code_fingerprint.part_hashes(("model", "step", "estimate")),
        "matrix": {"path": _shown(matrix_path), "sha256": _sha256(matrix_path)},
        "platforms": {_shown(f): _sha256(f) for f in files},
        "torch": torch.__version__,
    }


def stale_parts(doc: dict, matrix_path: Path) -> list[str]:
    """What changed since ``doc`` was made (empty: it is the running code's)."""
    from heptstudy.measure.estimate import code_fingerprint

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


def predict_run(request, progress=None) -> dict:
    """The blind prediction of one memory run (its :class:`MeasurementRequest`)."""
    from heptstudy.data import load_events
    from heptstudy.measure.bench import event_indices
    from heptstudy.measure.estimate.bench_process import simulate_bench_process
    from heptstudy.measure.estimate.fake_step import DEFAULT_TORCH_VERSION, estimate_step

    measurement = request.resolve()
    config, profile = measurement.config, measurement.profile
    target = profile.device if profile is not None else "cpu"
    version = getattr(profile, "torch_version", None) or DEFAULT_TORCH_VERSION
    indices = event_indices(config, request.batch_size, request.warmup + request.steps)
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
    passes = "memory" if request.passes == "memory" else "both"
    sim = simulate_bench_process(traces, warmup=request.warmup, passes=passes)
    out = {
        "batch_size": request.batch_size,
        "checkpointing": request.checkpointing,
        "overrides": list(request.overrides),
        "platform": profile.name if profile is not None else None,
        "target": target,
        "torch_version": version,
        "steps": request.steps,
        "warmup": request.warmup,
        "event_indices": indices,
        "allocated_mib": sim.max_allocated("native") / MIB,
        "reserved_mib": sim.max_reserved("native") / MIB,
        "expandable_allocated_mib": sim.max_allocated("expandable") / MIB,
        "expandable_reserved_mib": sim.max_reserved("expandable") / MIB,
        "tracked_peak_mib": max(tracked[request.warmup :] or tracked),
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
    if progress:
        progress(
            f"  {measurement.name}: allocated {out['allocated_mib']:,.0f} MiB, "
            f"reserved {out['reserved_mib']:,.0f} MiB (expandable "
            f"{out['expandable_reserved_mib']:,.0f}) in {out['seconds']:.0f} s"
        )
    return out


def predict_matrix(matrix_path: str, data_dir: str | None, progress=print) -> dict:
    """Blind predictions for every memory run of the matrix at ``matrix_path``."""
    from heptstudy.data.batching import dataset_for
    from heptstudy.study.matrix import load_matrix

    path = resolve_in_repo(matrix_path)
    matrix = load_matrix(path, data_dir=data_dir)
    runs, skipped, platforms, synthetic = {}, {}, [], None
    for run in matrix.runs:
        request = run.request(progress=False)
        if request.kind != "memory":
            skipped[run.name] = "parity run: no memory figure"
            continue
        if request.checkpointing == "auto":
            skipped[run.name] = (
                "checkpointing auto: the plan of each step is chosen on the GPU from auto's own "
                "calibration against the GPU's budget; the off and full runs bound it"
            )
            continue
        if request.platform:
            platforms.append(request.platform)
        if synthetic is None:
            config = request.resolve().config
            synthetic = bool(dataset_for(config, "train").metadata.get("synthetic"))
        runs[run.name] = predict_run(request, progress)
    return {
        "schema": SCHEMA,
        "what": (
            "blind predictions: the target-faithful fake step (fake CPU tensors, the target's "
            "autocast lists, kernel stand-ins and scratch) for every step of each run, the bench "
            "process replayed through the caching-allocator simulator; max over counted steps, "
            "MiB. Made without a GPU, before any GPU measured this code"
        ),
        "matrix": matrix.name,
        "data": {**DATA, "synthetic": bool(synthetic)},
        "fingerprint": fingerprint(path, platforms),
        "regenerate": REGENERATE,
        "runs": runs,
        "not_predicted": skipped,
    }


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("matrix", help="study matrix (e.g. configs/study/gpu.yaml)")
    parser.add_argument("--data-dir", required=True, help="the generated data the GPU carries")
    parser.add_argument("--out", default=PREDICTIONS, help=f"output JSON (default {PREDICTIONS})")
    args = parser.parse_args(argv)
    doc = predict_matrix(args.matrix, args.data_dir)
    out = resolve_in_repo(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
