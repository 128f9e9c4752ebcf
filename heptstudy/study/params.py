"""Notebook parameters: the first cell of each notebook hands its parameters here.

Papermill passes ``-p checkpointing true`` as the *string* ``"true"``; the strings
``true``/``false`` (any case), Python booleans and YAML booleans all mean what they say, and
anything else stops with a :class:`NotebookParameterError` that names the parameter, the value
and what is allowed.
"""

from __future__ import annotations

import os
import re
from typing import Any

from heptstudy.study.common import (
    AUTO_STEPS,
    DTYPES,
    VARIANTS,
    NotebookParameterError,
)


def _bad(name: str, value: Any, allowed: str, example: str) -> NotebookParameterError:
    return NotebookParameterError(
        f"parameter {name}={value!r} is not allowed: {allowed} "
        f"(for example papermill ... -p {name} {example})"
    )


def parse_bool(name: str, value: Any) -> bool:
    """``True``/``False``, YAML booleans, or the strings ``"true"``/``"false"`` in any case."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise _bad(name, value, "allowed values are true or false (any case)", "true")


def parse_int(name: str, value: Any, low: int, *, optional: bool = False) -> int | None:
    """An integer ``>= low`` (a string of digits is accepted); ``None`` only if ``optional``."""
    if value is None and optional:
        return None
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        allowed = f"allowed values are integers >= {low}" + (" or None" if optional else "")
        raise _bad(name, value, allowed, str(max(low, 1)))
    return value


def parse_choice(name: str, value: Any, choices: tuple[str, ...]) -> str | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    if isinstance(value, str) and value in choices:
        return value
    allowed = f"allowed values are {', '.join(choices)} or None (the default)"
    raise _bad(name, value, allowed, choices[0])


def parse_path(name: str, value: Any) -> str | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    if isinstance(value, (str, os.PathLike)):
        return str(value)
    raise _bad(name, value, "allowed values are a path (a string) or None", "path/to/dir")


def parse_overrides(name: str, value: Any) -> list[str]:
    """A list of ``key=value`` dotted overrides; a single string holds them separated by
    whitespace (``-p overrides "model.heptv2.width=256 train.seed=3"``)."""
    if value is None:
        return []
    items = value.split() if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(
        isinstance(i, str) and "=" in i for i in items
    ):
        raise _bad(
            name,
            value,
            "allowed values are a list of KEY=VALUE strings (-y 'overrides: [train.seed=3]') "
            "or one string of them separated by spaces",
            '"train.seed=3 model.heptv2.width=256"',
        )
    return list(items)


def parse_platform(name: str, value: Any) -> str | None:
    """A platform profile: a YAML path, or a name from ``configs/training/platforms``."""
    value = parse_path(name, value)
    if value is None:
        return None
    from heptstudy.scenario.model import PLATFORM_DIR, find_file

    found = find_file(value, PLATFORM_DIR)
    if found is not None:
        return str(found)
    names = sorted(p.stem for p in PLATFORM_DIR.glob("*.yaml"))
    raise _bad(
        name,
        value,
        f"allowed values are a platform YAML path or one of {', '.join(names)}",
        names[0],
    )


def _platform_is_gpu(platform: str | None) -> bool:
    if platform is not None:
        from heptstudy.config import load_platform

        return load_platform(platform).device != "cpu"
    import torch

    return torch.cuda.is_available()


def report_name(opts) -> str:
    """The report name of bench options (``checkpointed_selective_b4``, ...)."""
    from heptstudy.measure import bench

    return bench.report_name(opts, bench.resolve(opts)[0])


def default_output(opts) -> str:
    """``experiments/scratch/NAME.json``: where a notebook run without ``output`` writes."""
    from heptstudy.measure import bench

    return str(bench.default_output(opts))


def _common(
    *, batch_size, variant, platform, data_dir, dtype, seed, output, overrides
) -> dict[str, Any]:
    return dict(
        batch_size=parse_int("batch_size", batch_size, 1),
        variant=parse_choice("variant", variant, VARIANTS),
        platform=parse_platform("platform", platform),
        data_dir=parse_path("data_dir", data_dir),
        dtype=parse_choice("dtype", dtype, DTYPES),
        seed=parse_int("seed", seed, 0, optional=True),
        output=parse_path("output", output),
        overrides=parse_overrides("overrides", overrides),
    )


def memory_options(
    batch_size: Any = 1,
    checkpointing: Any = False,
    steps: Any = None,
    warmup: Any = None,
    variant: Any = None,
    platform: Any = None,
    data_dir: Any = None,
    dtype: Any = None,
    seed: Any = None,
    output: Any = None,
    overrides: Any = None,
    progress: bool = True,
):
    """The validated :class:`~heptstudy.measure.bench.BenchOptions` of ``memory.ipynb``.
    ``steps``/``warmup`` ``None``: 5/2 on a GPU, 2/1 on CPU. ``output`` ``None``:
    ``experiments/scratch/NAME.json``."""
    common = _common(
        batch_size=batch_size,
        variant=variant,
        platform=platform,
        data_dir=data_dir,
        dtype=dtype,
        seed=seed,
        output=output,
        overrides=overrides,
    )
    checkpointing = parse_bool("checkpointing", checkpointing)
    steps = parse_int("steps", steps, 1, optional=True)
    warmup = parse_int("warmup", warmup, 0, optional=True)
    if steps is None or warmup is None:
        auto = AUTO_STEPS["gpu" if _platform_is_gpu(common["platform"]) else "cpu"]
        steps = auto[0] if steps is None else steps
        warmup = auto[1] if warmup is None else warmup
    from heptstudy.measure.bench import BenchOptions

    opts = BenchOptions(
        checkpointing=checkpointing, steps=steps, warmup=warmup, progress=progress, **common
    )
    if opts.output is None:
        opts.output = default_output(opts)
    return opts


def parity_options(
    batch_size: Any = 1,
    deterministic: Any = False,
    variant: Any = None,
    platform: Any = None,
    data_dir: Any = None,
    dtype: Any = None,
    seed: Any = None,
    output: Any = None,
    overrides: Any = None,
    progress: bool = True,
):
    """The validated :class:`~heptstudy.measure.bench.BenchOptions` of ``parity.ipynb``."""
    common = _common(
        batch_size=batch_size,
        variant=variant,
        platform=platform,
        data_dir=data_dir,
        dtype=dtype,
        seed=seed,
        output=output,
        overrides=overrides,
    )
    from heptstudy.measure.bench import BenchOptions

    opts = BenchOptions(
        parity_only=True,
        deterministic=parse_bool("deterministic", deterministic),
        progress=progress,
        **common,
    )
    if opts.output is None:
        opts.output = default_output(opts)
    return opts


def pipeline_config(
    out_dir: Any = "experiments/pipeline",
    batch_size: Any = 2,
    num_steps: Any = 4,
    val_freq: Any = 2,
    checkpoint_freq: Any = 2,
    checkpointing: Any = True,
    data_dir: Any = None,
    seed: Any = None,
    overrides: Any = None,
):
    """The validated configuration of ``pipeline.ipynb``: a short CPU/GPU training run."""
    from heptstudy.config import load_config

    out_dir = parse_path("out_dir", out_dir) or "experiments/pipeline"
    settings = {
        "global_batch_size": parse_int("batch_size", batch_size, 1),
        "num_steps": parse_int("num_steps", num_steps, 1),
        "val_freq": parse_int("val_freq", val_freq, 1),
        "checkpoint_freq": parse_int("checkpoint_freq", checkpoint_freq, 1),
        "out_dir": out_dir,
    }
    seed = parse_int("seed", seed, 0, optional=True)
    if seed is not None:
        settings["seed"] = seed
    base = [f"train.{k}={v}" for k, v in settings.items()]
    base.append(
        f"model.heptv2.activation_checkpointing={parse_bool('checkpointing', checkpointing)}"
    )
    data_dir = parse_path("data_dir", data_dir)
    if data_dir:
        base.append(f"data.data_dir={data_dir}")
    return load_config(overrides=base + parse_overrides("overrides", overrides))
