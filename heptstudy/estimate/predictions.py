"""Blind predictions of a GPU study: the estimate of every memory run of a matrix, made before
any GPU measures that code, with the fingerprint of the code it was made from.

Not predicted: ``auto`` runs (they calibrate on the GPU) and parity runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import torch
import yaml

from heptstudy import fingerprint as code_fingerprint
from heptstudy.atomic import first_non_finite
from heptstudy.errors import HeptstudyError
from heptstudy.paths import base_dir, real_path, resolve_in_repo
from heptstudy.units import MIB

SCHEMA = "heptstudy.blind_predictions/1"
PREDICTIONS = "experiments/gpu_blind_predictions/predictions.json"
#: The GPU session whose events and PyTorch the GPU study repeats (scripts/gpu/README.md).
SESSION = "experiments/h200_2026-11-30/session.yaml"
#: Parts whose change makes the predictions stale (`make check-predictions` and
#: scripts/gpu/run.sh enforce them).
ENFORCED_PARTS = ("model", "step")
REGENERATE = "ONLY=predictions bash scripts/regenerate_fits.sh"
#: Each allocator mode's (allocated, reserved) figures of a run: MiB, reserved >= allocated.
FIGURES = (
    ("allocated_mib", "reserved_mib"),
    ("expandable_allocated_mib", "expandable_reserved_mib"),
)


class PredictionsError(HeptstudyError, ValueError):
    """A blind-predictions file is missing or not as ``heptstudy study predict`` writes it."""


def _refuse(path: Path, field: str, value, allowed: str):
    if isinstance(value, (dict, list)):
        shown = f"a JSON {'object' if isinstance(value, dict) else 'list'}"
    else:
        shown = json.dumps(value, allow_nan=True)
    raise PredictionsError(
        f"{path}: {field} is {shown[:80]}; allowed: {allowed}. The file is not as `heptstudy "
        f"study predict` writes it: restore the committed one (git checkout -- {path}) or "
        f"regenerate it with `{REGENERATE}`"
    )


def read_predictions(path: str | os.PathLike | None = None) -> dict:
    """The blind predictions at ``path`` (default: the committed file), checked."""
    path = Path(path) if path is not None else resolve_in_repo(PREDICTIONS)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PredictionsError(
            f"{path}: cannot read the blind predictions ({exc.strerror or exc}); make them "
            f"with `{REGENERATE}`"
        ) from None
    except ValueError as exc:  # JSONDecodeError and undecodable bytes
        raise PredictionsError(
            f"{path}: not valid JSON ({exc}); restore the committed file (git checkout -- "
            f"{path}) or regenerate it with `{REGENERATE}`"
        ) from None
    if not isinstance(doc, dict):
        _refuse(path, "the file", doc, f"a JSON object of schema {SCHEMA}")
    if doc.get("schema") != SCHEMA:
        _refuse(path, "schema", doc.get("schema"), repr(SCHEMA))
    for key in ("runs", "not_predicted", "fingerprint"):
        if not isinstance(doc.get(key), dict):
            _refuse(path, key, doc.get(key), "a JSON object")
    found = first_non_finite(doc)
    if found:
        _refuse(path, *found, "finite numbers only (JSON has no NaN or Infinity)")
    for name, run in doc["runs"].items():
        if not isinstance(run, dict):
            _refuse(path, f"runs.{name}", run, "a JSON object of the run's predicted figures")
        for allocated, reserved in FIGURES:
            for field in (allocated, reserved):
                value = run.get(field)
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                    _refuse(path, f"runs.{name}.{field}", value, "a number of MiB above 0")
            if run[reserved] < run[allocated]:
                _refuse(
                    path,
                    f"runs.{name}.{reserved}",
                    run[reserved],
                    f"at least {allocated} ({run[allocated]:,.1f} MiB): the allocator reserves "
                    "what it allocates",
                )
    return doc


def session_facts(path: str | os.PathLike | None = None) -> dict:
    """The facts of the GPU session at ``path`` (default :data:`SESSION`): device, PyTorch,
    commits and its data (``events_train``, ``events_test``, ``seed``)."""
    path = resolve_in_repo(path or SESSION)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise HeptstudyError(
            f"{path}: cannot read the GPU session's facts ({exc}); restore the committed file "
            f"(git checkout -- {path})"
        ) from None
    data = doc.get("data") if isinstance(doc, dict) else None
    keys = ("events_train", "events_test", "seed")
    if not isinstance(data, dict) or not all(type(data.get(k)) is int for k in keys):
        raise HeptstudyError(
            f"{path}: data is {json.dumps(data, default=str)[:80]}; allowed: an object with whole numbers "
            f"{', '.join(keys)} (the session's `heptstudy data generate` options); restore the "
            f"committed file (git checkout -- {path})"
        )
    if not isinstance(doc.get("torch_version"), str) or not isinstance(doc.get("device_kind"), str):
        raise HeptstudyError(
            f"{path}: torch_version and device_kind must be strings (e.g. '2.11.0+cu130', "
            f"'cuda'); restore the committed file (git checkout -- {path})"
        )
    return doc


def _sha256(path: Path) -> str:
    """Of the YAML's content, not its bytes: a comment changes no prediction."""
    content = yaml.safe_load(path.read_text())
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def _shown(path: Path) -> str:
    """Relative to the repository when inside it: no machine's folders get committed."""
    try:
        return str(real_path(path).relative_to(base_dir().resolve()))
    except ValueError:
        return str(path)


def fingerprint(matrix_path: Path, platform_files: list[Path]) -> dict:
    """The code, configuration and PyTorch the predictions are of."""
    files = sorted(set(platform_files))
    return {
        "code": code_fingerprint.part_hashes(("model", "step", "estimate")),
        "matrix": {"path": _shown(matrix_path), "sha256": _sha256(matrix_path)},
        "platforms": {_shown(f): _sha256(f) for f in files},
        "torch": torch.__version__,
    }


def stale_parts(doc: dict, matrix_path: Path) -> list[str]:
    """What changed since ``doc`` was made (empty: it is the running code's)."""
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
    """One memory run's prediction; ``profile`` None: the CPU."""
    # imported here: readers of the file do not load the estimator
    from heptstudy.data.batching import event_indices, load_events
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
