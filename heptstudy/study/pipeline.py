"""Helpers of ``pipeline.ipynb`` and ``explore.ipynb``."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from heptstudy.config import Config, load_config
from heptstudy.data.batching import to_device
from heptstudy.locks import LOCK_NAME, holding
from heptstudy.measure.parity import build_seeded
from heptstudy.measure.request import Count, Overrides, Parameters, PlanName
from heptstudy.meters.memory import make_meter
from heptstudy.paths import OUTPUT_ROOT
from heptstudy.study.common import StudyError
from heptstudy.train.optim import build_optimizer, build_scheduler
from heptstudy.train.precision import autocast_dtype
from heptstudy.train.step import run_step


class PipelineParameters(Parameters):
    out_dir: str | None = str(OUTPUT_ROOT / "pipeline")
    batch_size: Count = 2
    num_steps: Count = 4
    val_freq: Count = 2
    checkpoint_freq: Count = 2
    checkpointing: PlanName = "full"
    data_dir: str | None = None
    seed: int | None = Field(None, ge=0)
    overrides: Overrides = []

    def config(self, out_dir: str | None = None) -> Config:
        train: dict[str, Any] = {
            "global_batch_size": self.batch_size,
            "num_steps": self.num_steps,
            "val_freq": self.val_freq,
            "checkpoint_freq": self.checkpoint_freq,
            "out_dir": out_dir or self.out_dir or str(OUTPUT_ROOT / "pipeline"),
        }
        if self.seed is not None:
            train["seed"] = self.seed
        data = {"data_dir": self.data_dir} if self.data_dir else {}
        model = {"heptv2": {"activation_checkpointing": self.checkpointing}}
        return load_config(
            base={"model": model, "data": data, "train": train}, overrides=self.overrides
        )


def pipeline_parameters(namespace: Mapping[str, Any]) -> PipelineParameters:
    allowed = tuple(PipelineParameters.model_fields)
    return PipelineParameters.from_namespace(namespace, allowed, "pipeline.ipynb")


def fresh_output_dir(path: str | os.PathLike) -> Path:
    """An empty training output directory: an earlier pipeline run there is removed, never while
    a run holds the folder, and never a folder that does not look like a training run's."""
    path = Path(path)
    with holding(path, "pipeline out_dir"):
        found = [p for p in path.iterdir() if p.name != LOCK_NAME]
        if found and not ((path / "config.yaml").exists() or (path / "metrics.jsonl").exists()):
            raise StudyError(
                f"{path} exists and does not look like a training output directory; "
                "choose another out_dir or empty it yourself"
            )
        for p in found:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    path.mkdir(parents=True, exist_ok=True)
    return path


def read_metrics(path: str | os.PathLike) -> Any:
    """``metrics.jsonl`` of a training run as a DataFrame (train and validation records)."""
    import pandas as pd

    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return pd.DataFrame(rows).drop(columns=["event_index_by_rank"], errors="ignore")


def compare_resume(original, resumed) -> Any:
    """Training losses of the steps a resumed run repeated, next to the original run's."""
    import pandas as pd

    a = original[original["kind"] == "train"].set_index("step")
    b = resumed[resumed["kind"] == "train"].set_index("step")
    cols = [c for c in b.columns if c.startswith("loss_")]
    rows = [
        {
            "step": s,
            "loss": c.removeprefix("loss_"),
            "original": a.at[s, c],
            "resumed": b.at[s, c],
            "equal": bool(a.at[s, c] == b.at[s, c]),
        }
        for s in b.index
        if s in a.index
        for c in cols
    ]
    return pd.DataFrame(rows, columns=["step", "loss", "original", "resumed", "equal"])


def step_memory_timeline(config, batch, device=None) -> Any:
    """The ``StepMemory`` (with its timeline) of one step of a freshly seeded model."""
    import torch

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    batch = to_device(batch, device)
    model = build_seeded(config, device)
    model.train()
    optimizer = build_optimizer(model, config.train)
    scheduler = build_scheduler(optimizer, config.train)
    meter = make_meter(device, track_categories=True)
    dtype = autocast_dtype(config, device)
    return run_step(model, batch, optimizer, scheduler, config, dtype, meter=meter).memory
