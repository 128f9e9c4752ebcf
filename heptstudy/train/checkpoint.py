"""Training checkpoints: written atomically, read as data only.

A checkpoint holds the model, optimizer and scheduler states, the data loader's exact position,
the RNG states, the step and the resolved configuration. It is written to a temporary file in
the same directory and renamed into place, so a crash mid-write never destroys the previous
one, and loaded with ``weights_only=True``: a checkpoint is data, never code.
"""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from typing import Any

import torch

from heptstudy.atomic import atomic_open
from heptstudy.config import Config
from heptstudy.errors import HeptstudyError

FORMAT = "heptstudy.checkpoint/1"
#: Sections that must agree between a checkpoint and the run that resumes from it.
COMPATIBLE_SECTIONS = (
    "model",
    "data.dataset",
    "data.configs",
    "data.pad_to_multiple",
    "train.global_batch_size",
    "train.seed",
    "train.optimizer",
)

#: Settings that change memory or speed, never the weights: a run may change them on resume.
RUNTIME_KEYS = frozenset(
    {
        "activation_checkpointing",
        "activation_checkpointing_policy",
        "checkpoint_every",
        "attention_backend",
    }
)


class CheckpointError(HeptstudyError):
    pass


def atomic_torch_save(obj: Any, path: Path) -> None:
    with atomic_open(path, "wb") as fh:
        torch.save(obj, fh)


def rng_states() -> dict[str, Any]:
    states: dict[str, Any] = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1])}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    random.setstate((3, tuple(states["python"]), None))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save_checkpoint(
    path: Path, *, model, optimizer, scheduler, loader, step: int, config: Config
) -> None:
    atomic_torch_save(
        {
            "format": FORMAT,
            "step": step,
            "config": config.to_dict(),
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "loader": loader.state_dict(),
            "rng": rng_states(),
        },
        path,
    )


def load_checkpoint(path: str | Path, config: Config) -> dict[str, Any]:
    """Read and check a checkpoint; refuse an unreadable one or one from another configuration."""
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(
            f"checkpoint {str(p)!r} does not exist; give a file written by `heptstudy train`"
        )
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, ValueError, OSError) as err:
        raise CheckpointError(
            f"checkpoint {str(p)!r} is not a readable heptstudy checkpoint ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:200]}); it may be truncated or corrupted. Resume from an "
            "earlier checkpoint; nothing was written"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(
            f"checkpoint {str(p)!r} has format {state.get('format') if isinstance(state, dict) else None!r}, "
            f"expected {FORMAT!r}; nothing was written"
        )
    differences = _differences(state["config"], config.to_dict())
    if differences:
        listed = "; ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, a, b in differences[:8])
        raise CheckpointError(
            f"checkpoint {str(p)!r} comes from an incompatible configuration ({listed}). Resume "
            "with the configuration it was written with (it is stored in the checkpoint); "
            "nothing was written"
        )
    return state


def _differences(saved: dict, current: dict) -> list[tuple[str, Any, Any]]:
    out = []
    for key in COMPATIBLE_SECTIONS:
        a, b = _lookup(saved, key), _lookup(current, key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += [(f"{key}.{k}", x, y) for k, x, y in _flat_diff(a, b)]
        elif a != b:
            out.append((key, a, b))
    return out


def _flat_diff(a: dict, b: dict, prefix: str = "") -> list[tuple[str, Any, Any]]:
    out = []
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _flat_diff(x, y, f"{prefix}{k}.")
        elif x != y and k not in RUNTIME_KEYS:
            out.append((prefix + k, x, y))
    return out


def _lookup(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d
