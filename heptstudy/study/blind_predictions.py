"""Blind predictions of a GPU study matrix's memory runs, ``jobs`` processes at a time."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from heptstudy.data.batching import dataset_for
from heptstudy.estimate import predictions
from heptstudy.paths import resolve_in_repo
from heptstudy.study.common import PAIRED
from heptstudy.study.matrix import load_matrix

AUTO = (
    "checkpointing auto: the plan of each step is chosen on the GPU from auto's own "
    "calibration against the GPU's budget; the off and full runs bound it"
)


def _predict(path: Path, data_dir: str | None, name: str) -> dict:
    """The prediction of the matrix's run ``name`` (in a worker: requests are rebuilt there)."""
    request = next(r for r in load_matrix(path, data_dir=data_dir).runs if r.name == name)
    request = request.request(progress=False)
    measurement = request.resolve()
    return {
        "checkpointing": request.checkpointing,
        "overrides": list(request.overrides),
        **predictions.predict_run(
            measurement.config,
            measurement.profile,
            batch_size=request.batch_size,
            warmup=request.warmup,
            steps=request.steps,
            passes="memory" if request.passes == "memory" else "both",
        ),
    }


def predict_matrix(matrix_path: str, data_dir: str | None, progress=print, jobs: int = 1) -> dict:
    path = resolve_in_repo(matrix_path)
    matrix = load_matrix(path, data_dir=data_dir)
    todo, skipped, platforms, synthetic = {}, {}, [], None
    for run in matrix.runs:
        request = run.request(progress=False)
        if request.kind != "memory":
            skipped[run.name] = "parity run: no memory figure"
        elif run.notebook == PAIRED:
            skipped[run.name] = "paired timing: no memory figure"
        elif request.checkpointing == "auto":
            skipped[run.name] = AUTO
        else:
            todo[run.name] = request.batch_size * (request.warmup + request.steps)
            if request.platform:
                platforms.append(Path(request.platform))  # found when the request was validated
            if synthetic is None:
                config = request.resolve().config
                synthetic = bool(dataset_for(config, "train").metadata.get("synthetic"))
    # the largest runs first, so that the last one to finish is a small one
    order = sorted(todo, key=todo.get, reverse=True)
    # spawned workers: a forked PyTorch process may hold locks of threads it did not copy
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max(1, jobs), mp_context=context) as pool:
        futures = {name: pool.submit(_predict, path, data_dir, name) for name in order}
        runs = {}
        for name in order:
            runs[name] = predicted = futures[name].result()
            if progress:
                progress(
                    f"  {name}: allocated {predicted['allocated_mib']:,.0f} MiB, reserved "
                    f"{predicted['reserved_mib']:,.0f} MiB (expandable "
                    f"{predicted['expandable_reserved_mib']:,.0f}) in "
                    f"{predicted['seconds']:.0f} s"
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
        "data": {**predictions.session_facts()["data"], "synthetic": bool(synthetic)},
        "fingerprint": predictions.fingerprint(path, platforms),
        "regenerate": predictions.REGENERATE,
        "runs": {name: runs[name] for name in todo},
        "not_predicted": skipped,
    }
