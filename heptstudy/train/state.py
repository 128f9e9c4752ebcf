"""Training-state files (for resuming, not activation checkpointing): written atomically; the
``sha256`` catches overwritten bytes ``torch.load`` accepts; loaded ``weights_only`` (no code)."""

from __future__ import annotations

import hashlib
import pickle
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from heptstudy.atomic import atomic_open
from heptstudy.config import Config, as_yaml
from heptstudy.errors import HeptstudyError
from heptstudy.train.out_dir import latest_checkpoint

FORMAT = "heptstudy.training_state/3"
#: Written before each process's random state was kept: its one ``rng`` (the first process's) is
#: restored on every process, as the version that wrote it did; exact in one process.
ONE_RNG_FORMAT = "heptstudy.training_state/2"
#: Written before training-state files carried a digest; they cannot be verified.
UNVERIFIED_FORMATS = ("heptstudy.checkpoint/1",)
#: The parts of a training state and their types: the step, then mappings.
PARTS: dict[str, type] = {
    "step": int,
    **dict.fromkeys(("config", "model", "optimizer", "scheduler", "loader", "rng"), dict),
}
#: Settings a resumed run may change: where it reads and writes, how often it validates and saves,
#: and how it trades memory for time. Every other setting changes what runs (the weights, the
#: schedule, the batches), so a resume that changes one is refused rather than applied part way.
RESUMABLE_KEYS = frozenset(
    {
        "model.heptv2.activation_checkpointing",
        "model.heptv2.memory_budget_gib",
        "model.heptv2.auto_plan_order",
        "model.heptv2.attention_backend",
        "data.data_dir",
        "data.num_workers",
        "data.prefetch_batches",
        "train.out_dir",
        "train.val_freq",
        "train.checkpoint_freq",
    }
)


class TrainingStateError(HeptstudyError):
    pass


def _first_line(err: Exception) -> str:
    return (str(err).splitlines() or [""])[0][:200]


def state_digest(parts: Mapping[str, Any]) -> str:
    """SHA-256 over ``parts`` in a fixed order: keys, tensor dtypes, shapes and bytes, values."""
    h = hashlib.sha256()
    _feed(h, parts)
    return h.hexdigest()


def _feed(h, obj: Any) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(obj, Mapping):
        h.update(f"D{len(obj)}|".encode())
        for key in sorted(obj, key=repr):
            _feed(h, key)
            _feed(h, obj[key])
    elif isinstance(obj, (list, tuple)):  # a tuple may come back as a list: the same value
        h.update(f"L{len(obj)}|".encode())
        for item in obj:
            _feed(h, item)
    elif obj is None or isinstance(obj, (bool, int, float, str)):
        h.update(f"{type(obj).__name__}:{obj!r}|".encode())
    else:
        raise TypeError(f"a training state holds no {type(obj).__name__} ({obj!r})")


def rng_state() -> dict[str, Any]:
    """This process's random generators (numpy's global one is used nowhere: each use seeds its
    own generator, which the loader's state holds)."""
    state = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1])}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def save_training_state(
    path: Path, *, model, optimizer, scheduler, loader, step: int, config: Config, rng_by_rank
) -> None:
    """``rng_by_rank``: every process's :func:`rng_state`, by rank (under torchrun each draws
    its own dropout masks, so each continues its own sequence on resume)."""
    parts = {
        "step": step,
        "config": config.to_dict(),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "loader": loader.state_dict(),
        "rng": {"world_size": len(rng_by_rank), "by_rank": list(rng_by_rank)},
    }
    with atomic_open(path, "wb") as fh:
        torch.save({"format": FORMAT, "sha256": state_digest(parts), **parts}, fh)


def load_training_state(path: str | Path, config: Config, world_size: int = 1) -> dict[str, Any]:
    """Read and verify a training-state file before anything is written; ``world_size``: the
    number of processes that will continue it."""
    p = Path(path)

    def refused(problem: str) -> TrainingStateError:
        return TrainingStateError(f"--resume {str(p)!r}{problem}; nothing was written")

    if p.is_dir():
        latest = latest_checkpoint(p / "checkpoints") or latest_checkpoint(p)
        example = f", for example the latest there, {str(latest)!r}" if latest else ""
        raise refused(f" is a folder; give one training-state file{example}")
    if not p.is_file():
        raise refused(
            ": no such file; give a checkpoints/step_NNNNNN.pt file written by `heptstudy train`"
        )
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, ValueError, OSError) as err:
        raise refused(
            f" is not a readable training-state file ({type(err).__name__}: "
            f"{_first_line(err)}); it may be truncated or damaged. Resume "
            f"from an earlier checkpoint of the run"
        ) from None
    fmt = state.get("format") if isinstance(state, dict) else None
    if fmt in UNVERIFIED_FORMATS:
        raise refused(
            f" has format {fmt!r}, written before training-state files "
            f"carried a checksum, so its tensors cannot be verified; this version reads "
            f"{FORMAT!r}. Start a new run (`heptstudy train --new-run`) or resume with the "
            f"heptstudy version that wrote it"
        )
    if fmt not in (FORMAT, ONE_RNG_FORMAT):
        raise refused(
            f" has format {fmt!r}, expected {FORMAT!r}: it is not a "
            f"training-state file of `heptstudy train`"
        )
    if missing := [k for k in (*PARTS, "sha256") if k not in state]:
        raise refused(
            f" lacks {', '.join(repr(k) for k in missing)}; a training-state "
            f"file holds {', '.join(repr(k) for k in (*PARTS, 'sha256'))}. It was not written by "
            f"`heptstudy train` or was edited: resume from another checkpoint"
        )
    if wrong := [
        f"{k!r} is a {type(state[k]).__name__}"
        for k, kind in PARTS.items()
        if not isinstance(state[k], kind) or isinstance(state[k], bool)
    ]:
        raise refused(
            f": {', '.join(wrong)}, which no training-state file holds "
            f"(step is an integer, the other parts mappings); resume from another checkpoint"
        )
    if state.get("sha256") != state_digest({k: state[k] for k in PARTS}):
        raise refused(
            ": its contents do not match the sha256 checksum written with "
            "them (the file was changed or damaged after it was written). Resume from another "
            "checkpoint of the run (the previous step_*.pt)"
        )
    if differences := _differences(state["config"], config.to_dict()):
        listed = "; ".join(
            f"{k}: checkpoint {as_yaml(a)}, now {as_yaml(b)}" for k, a, b in differences
        )
        raise refused(
            f" was written with other settings than this run's ({listed}). A resume continues "
            "the run exactly as it was configured (its schedule included); resume without "
            "changing these settings (the checkpoint's are in its run folder's config.yaml), or "
            "start a new run (--new-run) to train with the new ones"
        )
    steps = config.train.num_steps
    if not 1 <= state["step"] <= steps:
        raise refused(
            f": its 'step' is {state['step']}, but a checkpoint of this run is written after "
            f"step 1 to {steps} (train.num_steps). It was not written by `heptstudy train` as "
            "it is now: resume from another checkpoint of the run, or start a new run"
        )
    if fmt == ONE_RNG_FORMAT:
        return {**state, "rng": {"world_size": None, "by_rank": [state["rng"]]}}
    if (problem := _other_world_size(state["rng"].get("world_size"), world_size)) is not None:
        raise refused(problem)
    return state


def _other_world_size(saved, world_size: int) -> str | None:
    if saved == world_size:
        return None
    return (
        f" was written by a run of {saved} processes and this one has {world_size}: each "
        "process continues its own random sequence (dropout) and its own share of the "
        f"batches, so a resume needs the same number. Resume with {saved} processes (torchrun's "
        f"--nnodes x --nproc-per-node = {saved}), or start a new run (--new-run)"
    )


def restore_training_state(
    state: dict[str, Any], path, *, model, optimizer, scheduler, loader, rank: int = 0
):
    """Load a verified state (from :func:`load_training_state`) into the run's objects and
    ``rank``'s random generators; a part that does not fit is named."""
    for name, load in (
        ("model", model.load_state_dict),  # strict: its default
        ("optimizer", optimizer.load_state_dict),
        ("scheduler", scheduler.load_state_dict),
        ("loader", loader.load_state_dict),
        ("rng", lambda rng: _set_rng_state(rng, rank)),
    ):
        try:
            load(state[name])
        except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as err:
            raise TrainingStateError(
                f"--resume {str(path)!r}: its {name!r} state does not fit this run "
                f"({type(err).__name__}: {_first_line(err)}); resume "
                "with the heptstudy version and configuration that wrote it"
            ) from None
    return int(state["step"])


def _set_rng_state(rng: dict[str, Any], rank: int) -> None:
    # a file of the one-RNG format (world_size None) holds the first process's alone
    mine = rng["by_rank"][rank if rng["world_size"] is not None else 0]
    torch.set_rng_state(mine["torch"])
    random.setstate((3, tuple(mine["python"]), None))
    if "cuda" in mine and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(mine["cuda"])


def _differences(a: dict, b: dict, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """The settings (dotted keys) that differ, less :data:`RESUMABLE_KEYS`."""
    out = []
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _differences(x, y, f"{prefix}{k}.")
        elif x != y and prefix + k not in RESUMABLE_KEYS:
            out.append((prefix + k, x, y))
    return out
