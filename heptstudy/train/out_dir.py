"""Where a training run writes (``train.out_dir``): never over an earlier run. A non-empty one
is refused unless ``--new-run`` (``OUT/run-002``, ...) or ``--resume CKPT`` (the folder that
wrote it; later steps' files there are refused, not replaced)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from heptstudy.atomic import atomic_write_text, folder_write_problem
from heptstudy.errors import HeptstudyError
from heptstudy.locks import LOCK_NAME

RUN_NAME = re.compile(r"^run-(\d{3,})$")
STEP_FILE = re.compile(r"^step_(\d+)\.(pt|npz)$")


class OutputDirError(HeptstudyError):
    pass


def choose_out_dir(
    out_dir: str | Path,
    *,
    new_run: bool = False,
    resume: str | Path | None = None,
    resume_step: int = 0,
) -> Path:
    """The folder this run writes to; ``resume`` is the training-state file resumed from."""
    out = Path(out_dir)
    _refuse_unwritable(out)
    files = _files_below(out)
    if not files:
        return out
    shown = ", ".join(str(f.relative_to(out)) for f in files[:3]) + (", ..." if files[3:] else "")
    if not _holds_runs(out):
        what = "a TFDS data set" if any(f.name == "dataset_info.json" for f in files) else "files"
        raise OutputDirError(
            f"train.out_dir={str(out)!r} holds {what} that no training run wrote ({len(files)} "
            f"files: {shown}); a run is written only into a new or empty folder or beside earlier "
            "runs, so nothing was written. Set train.out_dir to a new folder"
        )
    if new_run:
        return out / f"run-{_next_run_number(out):03d}"
    if resume is not None:
        target = _run_of(Path(resume), out)
        if target is not None:
            _refuse_later_steps(target, resume_step)
            return target
    latest = latest_checkpoint(out / "checkpoints")
    resume_hint = (
        f"To continue that run give --resume {latest}"
        if latest
        else "To continue a run give --resume with one of its checkpoints/step_*.pt"
    )
    raise OutputDirError(
        f"train.out_dir={str(out)!r} already holds an earlier run ({len(files)} files: {shown}); "
        f"a new run would replace or append to them, so nothing was written. {resume_hint}; to "
        f"start a new run next to it give --new-run (it writes to "
        f"{str(out / f'run-{_next_run_number(out):03d}')!r}); or set train.out_dir to a new folder"
    )


def recheck_held(out: Path, resume_step: int | None) -> None:
    """Under the run's lock, what :func:`choose_out_dir` decided still holds (no run that wrote
    there meanwhile is joined)."""
    if resume_step is not None:
        _refuse_later_steps(out, resume_step)
        return
    if files := _files_below(out):
        raise OutputDirError(
            f"train.out_dir={str(out)!r} was written by another run while this one started "
            f"({len(files)} files, e.g. {files[0].relative_to(out)}); nothing was written. Run "
            "the command again (with --new-run for a run next to it)"
        )


def _refuse_unwritable(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise OutputDirError(
            f"train.out_dir={str(out)!r} is a file, not a folder; set train.out_dir to a folder"
        )
    existing = out
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise OutputDirError(
            f"train.out_dir={str(out)!r} cannot be created: {str(existing)!r} is a file, not a "
            "folder; choose another train.out_dir (nothing was written)"
        )
    # a probe file: root passes os.access on read-only mounts and full quotas
    if (problem := folder_write_problem(existing)) is not None:
        raise OutputDirError(
            f"train.out_dir={str(out)!r} cannot be written: {str(existing)!r} takes no new file "
            f"({problem}); choose a train.out_dir you can write to (nothing was written)"
        )


def _holds_runs(out: Path) -> bool:
    """Whether ``out`` is a training run's folder (or holds numbered runs): what a run writes
    first is its configuration and its metrics."""
    names = ("metrics.jsonl", "checkpoints", "predictions")
    return any((out / n).exists() for n in names) or any(
        RUN_NAME.match(p.name) or p.name.startswith("config") and p.suffix == ".yaml"
        for p in out.iterdir()
    )


def _files_below(out: Path) -> list[Path]:
    if not out.is_dir():
        return []
    # the lock file of a run that was killed is not a result (heptstudy.locks takes it over)
    return sorted(p for p in out.rglob("*") if not p.is_dir() and p.name != LOCK_NAME)


def _next_run_number(out: Path) -> int:
    taken = [int(m.group(1)) for p in out.iterdir() if (m := RUN_NAME.match(p.name))]
    return max([1, *taken]) + 1


def _run_of(checkpoint: Path, out: Path) -> Path | None:
    """The run folder that wrote ``checkpoint`` when it is ``out`` or a numbered run in it."""
    if checkpoint.parent.name != "checkpoints":
        return None
    run = checkpoint.resolve().parent.parent
    root = out.resolve()
    if run == root:
        return out
    return out / run.name if run.parent == root and RUN_NAME.match(run.name) else None


def step_of(path: Path) -> int:
    """The step of a ``step_NNNNNN.pt`` or ``.npz`` file; -1 for another name."""
    return int(m.group(1)) if (m := STEP_FILE.match(path.name)) else -1


def _refuse_later_steps(run: Path, step: int) -> None:
    if later := sorted(
        str(p.relative_to(run))
        for folder in ("checkpoints", "predictions")
        if (run / folder).is_dir()
        for p in (run / folder).iterdir()
        if step_of(p) > step
    ):
        raise OutputDirError(
            f"resuming step {step} in {str(run)!r} would replace files of later steps, written "
            f"by an attempt that got further: {', '.join(later[:4])}; nothing was written. "
            "Resume from the latest checkpoint of that run, or give --new-run as well to continue "
            "in a new numbered run next to it"
        )


def latest_checkpoint(folder: Path) -> Path | None:
    """The ``step_*.pt`` file of ``folder`` with the highest step number."""
    found = list(folder.glob("step_*.pt")) if folder.is_dir() else []
    return max(found, key=step_of) if found else None


def drop_records_after(run: Path, step: int) -> None:
    """Remove from the run's ``metrics.jsonl`` the records of the steps after ``step``, the
    latest checkpoint's: those steps are not kept, and a resume runs them again."""
    metrics = run / "metrics.jsonl"
    if not metrics.is_file():
        return
    lines = metrics.read_text().splitlines(keepends=True)
    kept = [line for line in lines if _record_step(line) <= step]
    if kept != lines:
        atomic_write_text(metrics, "".join(kept))


def _record_step(line: str) -> float:
    # a line a killed run left unfinished is no record, and what follows would join it
    if not line.endswith("\n"):
        return math.inf
    try:
        return float(json.loads(line)["step"])
    except (ValueError, TypeError, KeyError):
        return math.inf


def config_file_name(run: Path, text: str, resume_step: int | None) -> Path:
    """``config.yaml``, or ``config.resumed_step_NNNNNN[.k].yaml`` when a resume changes it."""
    path = run / "config.yaml"
    if resume_step is None or not path.exists() or path.read_text() == text:
        return path
    k, stem = 0, f"config.resumed_step_{resume_step:06d}"
    while (candidate := run / (f"{stem}.yaml" if k == 0 else f"{stem}.{k}.yaml")).exists():
        if candidate.read_text() == text:
            return candidate
        k += 1
    return candidate
