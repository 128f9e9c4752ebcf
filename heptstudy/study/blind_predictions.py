"""Blind predictions of a GPU study matrix: every memory run's own request resolved as a study
run would resolve it, then estimated by :func:`heptstudy.estimate.predictions.predict_run`."""

from __future__ import annotations

from pathlib import Path

from heptstudy.data.batching import dataset_for
from heptstudy.estimate import predictions
from heptstudy.measure.request import find_platform
from heptstudy.paths import resolve_in_repo
from heptstudy.study.matrix import load_matrix


def predict_matrix(matrix_path: str, data_dir: str | None, progress=print) -> dict:
    """Blind predictions for every memory run of the matrix at ``matrix_path``."""
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
            platforms.append(Path(find_platform(request.platform)))
        measurement = request.resolve()
        if synthetic is None:
            synthetic = bool(dataset_for(measurement.config, "train").metadata.get("synthetic"))
        predicted = predictions.predict_run(
            measurement.config,
            measurement.profile,
            batch_size=request.batch_size,
            warmup=request.warmup,
            steps=request.steps,
            passes="memory" if request.passes == "memory" else "both",
        )
        runs[run.name] = {
            "checkpointing": request.checkpointing,
            "overrides": list(request.overrides),
            **predicted,
        }
        if progress:
            progress(
                f"  {measurement.name}: allocated {predicted['allocated_mib']:,.0f} MiB, "
                f"reserved {predicted['reserved_mib']:,.0f} MiB (expandable "
                f"{predicted['expandable_reserved_mib']:,.0f}) in {predicted['seconds']:.0f} s"
            )
    return {
        "schema": predictions.SCHEMA,
        "what": (
            "blind predictions: the target-faithful fake step (fake CPU tensors, the target's "
            "autocast lists, kernel stand-ins and scratch) for every step of each run, the bench "
            "process replayed through the caching-allocator simulator; max over counted steps, "
            "MiB. Made without a GPU, before any GPU measured this code"
        ),
        "matrix": matrix.name,
        "data": {**predictions.DATA, "synthetic": bool(synthetic)},
        "fingerprint": predictions.fingerprint(path, platforms),
        "regenerate": predictions.REGENERATE,
        "runs": runs,
        "not_predicted": skipped,
    }
