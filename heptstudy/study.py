"""The notebook-driven study: notebook parameters, the matrix runner, aggregation, the HTML report.

* :func:`memory_options`, :func:`parity_options`, :func:`pipeline_params`: the first cell of each
  notebook hands its parameters here. Papermill passes ``-p checkpointing true`` as the *string*
  ``"true"``; the strings ``true``/``false`` (any case), Python booleans and YAML booleans all mean
  what they say, and anything else stops with a :class:`NotebookParameterError` that names the
  parameter, the value and what is allowed.
* :func:`run_study` (``heptstudy study run --matrix FILE --out DIR``): every measurement of a
  matrix (``configs/study/*.yaml``) is its own Papermill execution of ``notebooks/memory.ipynb``
  or ``notebooks/parity.ipynb`` in a fresh kernel; the executed notebooks are kept; existing
  reports are skipped unless ``force``; a run that runs out of memory or whose kernel dies is
  recorded as a report with status ``oom``/``error``. Then ``notebooks/aggregate.ipynb`` is
  executed and rendered with ``jupyter nbconvert --to html --no-input`` into ``DIR/report.html``.
* :func:`load_reports`, :func:`reports_frame`, :func:`comparison_frame`, :func:`parity_frame`:
  pandas tables of an experiments directory for ``aggregate.ipynb``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heptstudy.errors import ConfigError, HeptstudyError

#: Memory measurements of a matrix run ``memory.ipynb``; parity runs ``parity.ipynb``.
MEMORY, PARITY = "memory", "parity"
NOTEBOOKS = {MEMORY: "memory.ipynb", PARITY: "parity.ipynb"}
VARIANTS = ("hit_heptv2_grouped_tracker_features", "track_cluster_mlpf")
DTYPES = ("float32", "bfloat16")
#: Steps and warm-up when a notebook leaves them at ``None``: the GPU protocol of the original
#: measurements, and fewer on CPU where one full-size step takes tens of seconds.
AUTO_STEPS = {"gpu": (5, 2), "cpu": (2, 1)}

SMOKE_STATEMENT = (
    "These are short smoke measurements (a few steps per configuration), not a throughput or "
    "convergence study."
)


class NotebookParameterError(HeptstudyError, ValueError):
    """A notebook (or matrix) parameter has a value the study cannot use."""


class StudyError(HeptstudyError):
    """A study matrix, experiments directory or rendering step is unusable."""


# --------------------------------------------------------------------------------------------
# Where things are
# --------------------------------------------------------------------------------------------


def project_root() -> Path:
    """The checkout holding this package (``configs/`` and ``notebooks/`` live there)."""
    return Path(__file__).resolve().parent.parent


def notebooks_dir() -> Path:
    return project_root() / "notebooks"


def at_project_root() -> Path:
    """In JupyterLab the kernel starts in ``notebooks/``; move to the project root so that the
    relative paths of the study (``data/tfds``, ``experiments/``, ``figures/``) mean the same as
    on the command line. Anywhere else the working directory is left alone."""
    cwd = Path.cwd().resolve()
    root = project_root()
    if cwd == root / "notebooks":
        os.chdir(root)
    return Path.cwd()


# --------------------------------------------------------------------------------------------
# Notebook parameters
# --------------------------------------------------------------------------------------------


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
    if Path(value).is_file():
        return value
    bundled = project_root() / "configs" / "training" / "platforms" / f"{value}.yaml"
    if bundled.is_file():
        return str(bundled)
    names = sorted(p.stem for p in bundled.parent.glob("*.yaml"))
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
    from heptstudy.measure.bench import BenchOptions, default_output

    opts = BenchOptions(
        checkpointing=checkpointing, steps=steps, warmup=warmup, progress=progress, **common
    )
    if opts.output is None:
        opts.output = str(default_output(opts))
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
    from heptstudy.measure.bench import BenchOptions, default_output

    opts = BenchOptions(
        parity_only=True,
        deterministic=parse_bool("deterministic", deterministic),
        progress=progress,
        **common,
    )
    if opts.output is None:
        opts.output = str(default_output(opts))
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


# --------------------------------------------------------------------------------------------
# Study matrices
# --------------------------------------------------------------------------------------------

_MEMORY_KEYS = (
    "batch_size",
    "checkpointing",
    "steps",
    "warmup",
    "variant",
    "platform",
    "data_dir",
    "dtype",
    "seed",
    "overrides",
)
_PARITY_KEYS = (
    "batch_size",
    "deterministic",
    "variant",
    "platform",
    "data_dir",
    "dtype",
    "seed",
    "overrides",
)
_RUN_KEYS = {"notebook", "name", *_MEMORY_KEYS, "deterministic"}


@dataclass
class Run:
    """One measurement of a matrix: a notebook and its (validated) parameters."""

    name: str
    notebook: str  # "memory" or "parity"
    parameters: dict[str, Any]

    def options(self, output: str | None = None, progress: bool = True):
        build = memory_options if self.notebook == MEMORY else parity_options
        return build(**self.parameters, output=output, progress=progress)


@dataclass
class Matrix:
    name: str
    description: str
    runs: list[Run]
    path: Path
    cell_timeout_s: int | None = None
    figures_dir: str | None = None
    notes: list[str] = field(default_factory=list)


def load_matrix(path: str | os.PathLike, data_dir: str | None = None) -> Matrix:
    """Read and check a study matrix: every run's parameters are validated before anything runs.

    Format::

        name: cpu_default
        description: one paragraph (shown in the report)
        notes: [lines shown in the report]
        cell_timeout_s: 3600          # optional, per notebook cell
        figures_dir: figures/NAME     # optional; default figures/<name of the --out directory>
        defaults: {platform: local_cpu, steps: 2, warmup: 1}   # for every run
        runs:
          - {batch_size: 1, checkpointing: false}                  # memory.ipynb
          - {notebook: parity, batch_size: 1, deterministic: true} # parity.ipynb
    """
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise StudyError(f"cannot read the study matrix {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise StudyError(f"study matrix {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list) or not data["runs"]:
        raise StudyError(
            f"study matrix {path}: needs a non-empty 'runs:' list (see configs/study/)"
        )
    unknown = set(data) - {
        "name",
        "description",
        "notes",
        "cell_timeout_s",
        "figures_dir",
        "defaults",
        "runs",
    }
    if unknown:
        raise StudyError(f"study matrix {path}: unknown top-level keys {sorted(unknown)}")
    defaults = dict(data.get("defaults") or {})
    if data_dir:  # the command line's --data-dir: the default of every run
        defaults["data_dir"] = str(data_dir)
    bad = (set(defaults) - _RUN_KEYS) | ({"notebook", "name"} & set(defaults))
    if bad:
        raise StudyError(f"study matrix {path}: 'defaults' cannot set {sorted(bad)}")
    runs: list[Run] = []
    for i, entry in enumerate(data["runs"]):
        where = f"study matrix {path}, run {i + 1}"
        if not isinstance(entry, dict):
            raise StudyError(f"{where}: each run is a mapping of parameters, got {entry!r}")
        unknown = set(entry) - _RUN_KEYS
        if unknown:
            raise StudyError(
                f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_RUN_KEYS)}"
            )
        notebook = entry.get("notebook", MEMORY)
        if notebook not in NOTEBOOKS:
            raise StudyError(f"{where}: notebook {notebook!r} is not one of {sorted(NOTEBOOKS)}")
        keys = _MEMORY_KEYS if notebook == MEMORY else _PARITY_KEYS
        misplaced = set(entry) & (set(_RUN_KEYS) - set(keys) - {"notebook", "name"})
        if misplaced:
            raise StudyError(f"{where}: {sorted(misplaced)} do not apply to {notebook}.ipynb")
        params = {k: v for k, v in {**defaults, **entry}.items() if k in keys}
        run = Run(name="", notebook=notebook, parameters=params)
        try:
            opts = run.options(progress=False)
        except HeptstudyError as err:
            raise StudyError(f"{where}: {err}") from None
        run.name = str(entry.get("name") or opts.name)
        runs.append(run)
    names = [r.name for r in runs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise StudyError(
            f"study matrix {path}: several runs are named {dupes}; give them a 'name:'"
        )
    return Matrix(
        name=str(data.get("name") or path.stem),
        description=str(data.get("description") or ""),
        runs=runs,
        path=path,
        cell_timeout_s=data.get("cell_timeout_s"),
        figures_dir=data.get("figures_dir"),
        notes=[str(n) for n in data.get("notes") or []],
    )


# --------------------------------------------------------------------------------------------
# Running a matrix
# --------------------------------------------------------------------------------------------


@dataclass
class RunResult:
    name: str
    status: str  # "ok", "oom", "error", "skipped"
    report: Path
    notebook: Path | None
    seconds: float = 0.0
    message: str = ""


def _papermill(
    input_nb: Path, output_nb: Path, parameters: dict, timeout: int | None, cwd: Path
) -> None:
    import papermill as pm

    pm.execute_notebook(
        str(input_nb),
        str(output_nb),
        parameters=parameters,
        kernel_name="python3",
        progress_bar=False,
        cwd=str(cwd),
        execution_timeout=timeout,
    )


def _failure_report(run: Run, report_path: Path, err: BaseException) -> tuple[str, str]:
    """Write a report saying why a run produced none: out of memory, a dead kernel, an error."""
    import torch

    from heptstudy.measure import report as rp
    from heptstudy.measure.bench import resolve

    opts = run.options(output=str(report_path), progress=False)
    config, device, platform_name = resolve(opts)
    ename = getattr(err, "ename", type(err).__name__)
    evalue = getattr(err, "evalue", str(err))
    text = f"{ename}: {evalue}".strip()
    status, notes = "error", []
    if "OutOfMemory" in ename or "out of memory" in evalue.lower():
        status = "oom"
    elif "DeadKernel" in type(err).__name__ or "Kernel died" in str(err):
        text = (
            f"the kernel died during the run ({type(err).__name__}: {str(err).strip()[:200]}); "
            "on CPU this is most often the kernel being killed for lack of host memory"
        )
        notes.append(
            "kernel died: no measurement; the executed notebook shows the last cell reached"
        )
    elif "Timeout" in type(err).__name__:
        text = f"a cell ran past the matrix's cell_timeout_s ({type(err).__name__}: {str(err).strip()[:200]})"
    synthetic = False
    try:
        from heptstudy.data.batching import dataset_for

        synthetic = bool(dataset_for(config, "train").metadata.get("synthetic", False))
    except Exception:  # noqa: BLE001 - the data set itself may be what failed
        pass
    fields: dict[str, Any] = dict(
        kind=PARITY if opts.parity_only else MEMORY,
        status=status,
        name=opts.name,
        error=text[:2000],
        environment=rp.environment_info(
            device, config.train.dtype, platform_name, fresh_process=True
        ),
        data=rp.DataInfo(
            dataset=config.data.dataset,
            data_dir=config.data.data_dir,
            synthetic=synthetic,
            split="train",
        ),
        config=config.to_dict(),
        batch_size=opts.batch_size,
        checkpointing=rp.Checkpointing(enabled=opts.checkpointing),
        notes=[
            *notes,
            f"recorded by heptstudy study run: {run.notebook}.ipynb did not write a report",
        ],
    )
    if status == "oom":
        fields["oom"] = rp.OomInfo(
            message=text.splitlines()[0][:500],
            batch_size=opts.batch_size,
            padded_hits=[],
            device_memory_bytes=(
                torch.cuda.get_device_properties(device).total_memory
                if device.type == "cuda"
                else None
            ),
        )
    rp.write_report(rp.BenchReport(**fields), report_path)
    return status, text


def run_one(
    run: Run, out_dir: Path, *, force: bool = False, timeout: int | None = None
) -> RunResult:
    """One measurement: ``memory.ipynb`` or ``parity.ipynb`` in a fresh kernel, its executed
    notebook kept in ``out_dir/notebooks/``, its report ``out_dir/NAME.json``."""
    from heptstudy.measure.report import ReportError, read_report

    report_path = out_dir / f"{run.name}.json"
    nb_path = out_dir / "notebooks" / f"{run.name}.ipynb"
    if report_path.exists() and not force:
        try:
            status = read_report(report_path).status
        except ReportError:
            status = "unreadable"
        return RunResult(
            run.name, "skipped", report_path, nb_path, message=f"report exists ({status})"
        )
    nb_path.parent.mkdir(parents=True, exist_ok=True)
    if force and report_path.exists():
        report_path.unlink()
    parameters = {**run.parameters, "output": str(report_path.resolve())}
    t0 = time.perf_counter()
    try:
        _papermill(
            notebooks_dir() / NOTEBOOKS[run.notebook], nb_path, parameters, timeout, Path.cwd()
        )
    except Exception as err:  # noqa: BLE001 - an OOM or a dead kernel is a result, not a crash
        seconds = time.perf_counter() - t0
        if report_path.exists():  # the notebook wrote its report, then something later failed
            return RunResult(
                run.name,
                read_report(report_path).status,
                report_path,
                nb_path,
                seconds,
                f"report written, then: {type(err).__name__}",
            )
        status, text = _failure_report(run, report_path, err)
        return RunResult(
            run.name, status, report_path, nb_path, seconds, text.splitlines()[0][:200]
        )
    seconds = time.perf_counter() - t0
    if not report_path.exists():
        status, text = _failure_report(
            run, report_path, RuntimeError("the notebook finished without writing a report")
        )
        return RunResult(run.name, status, report_path, nb_path, seconds, text)
    return RunResult(run.name, read_report(report_path).status, report_path, nb_path, seconds)


def run_study(
    matrix_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    force: bool = False,
    figures_dir: str | os.PathLike | None = None,
    progress: bool = True,
    aggregate: bool = True,
    data_dir: str | os.PathLike | None = None,
) -> list[RunResult]:
    """Every run of the matrix, then ``aggregate.ipynb`` and ``out_dir/report.html``.
    ``data_dir`` replaces the matrix's default data directory."""
    from tqdm.auto import tqdm

    matrix = load_matrix(matrix_path, data_dir=str(data_dir) if data_dir else None)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "matrix.yaml").write_text(matrix.path.read_text())
    results: list[RunResult] = []
    bar = tqdm(
        matrix.runs, desc=f"study {matrix.name}", unit="run", disable=not progress, file=sys.stdout
    )
    for run in bar:
        bar.set_postfix_str(run.name)
        result = run_one(run, out, force=force, timeout=matrix.cell_timeout_s)
        results.append(result)
        line = f"{result.name:<28} {result.status:<8}"
        line += f" {result.seconds:7.1f} s" if result.status != "skipped" else ""
        line += f"  {result.message}" if result.message else ""
        (bar.write if progress else print)(line)
    bar.close()
    if aggregate:
        figures = Path(figures_dir or matrix.figures_dir or Path("figures") / out.name)
        aggregate_study(out, figures, matrix=matrix, timeout=matrix.cell_timeout_s)
    return results


def aggregate_study(
    out_dir: str | os.PathLike,
    figures_dir: str | os.PathLike,
    *,
    matrix: Matrix | None = None,
    timeout: int | None = None,
) -> Path:
    """Execute ``aggregate.ipynb`` on ``out_dir`` (figures to ``figures_dir``) and render
    ``out_dir/report.html`` without the code cells."""
    out = Path(out_dir)
    executed = out / "aggregate.ipynb"
    parameters = {
        "experiments_dir": str(out.resolve()),
        "figures_dir": str(Path(figures_dir).resolve()),
        "title": f"Activation checkpointing in HEPTv2: {matrix.name if matrix else out.name}",
        "description": matrix.description if matrix else "",
        "notes": list(matrix.notes) if matrix else [],
    }
    _papermill(notebooks_dir() / "aggregate.ipynb", executed, parameters, timeout, Path.cwd())
    return render_html(executed, out / "report.html")


def render_html(notebook: str | os.PathLike, html: str | os.PathLike) -> Path:
    """``jupyter nbconvert --to html --no-input``: figures are embedded in the page."""
    notebook, html = Path(notebook), Path(html)
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        "nbconvert",
        "--to",
        "html",
        "--no-input",
        "--output-dir",
        str(html.parent.resolve()),
        "--output",
        html.stem,
        str(notebook),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise StudyError(
            f"rendering {notebook} to HTML failed ({' '.join(cmd)}):\n{res.stderr[-2000:]}"
        )
    return html


# --------------------------------------------------------------------------------------------
# Aggregation: an experiments directory as pandas tables
# --------------------------------------------------------------------------------------------


def load_reports(experiments_dir: str | os.PathLike) -> list[tuple[Path, Any]]:
    """Every ``*.json`` report directly in ``experiments_dir`` (sorted by name). Files that are
    not valid reports are skipped with a warning, so one bad file does not hide the others."""
    import warnings

    from heptstudy.measure.report import ReportError, read_report

    found = []
    for path in sorted(Path(experiments_dir).glob("*.json")):
        try:
            found.append((path, read_report(path)))
        except ReportError as err:
            warnings.warn(f"skipped {path.name}: {str(err).splitlines()[0]}", stacklevel=2)
    return found


def reports_frame(reports) -> Any:
    """One row per report: what ran, where, its status and its summary numbers."""
    import pandas as pd

    rows = []
    for path, r in reports:
        s = r.summary
        counted = [st for st in r.steps if st.counted]
        rows.append(
            {
                "file": path.name,
                "name": r.name or path.stem,
                "kind": r.kind,
                "status": r.status,
                "batch_size": r.batch_size,
                "checkpointing": r.checkpointing.enabled,
                "policy": r.checkpointing.policy if r.checkpointing.enabled else "none",
                "peak_allocated_mib": s.max_peak_allocated_mib if s else None,
                "peak_reserved_mib": s.max_peak_reserved_mib if s else None,
                "mean_step_s": s.mean_step_time_s if s else None,
                "std_step_s": s.std_step_time_s if s else None,
                "counted_steps": s.counted_steps if s else None,
                "warmup_steps": s.warmup_steps if s else None,
                "max_padded_hits": max(
                    (max(st.padded_hits) for st in counted if st.padded_hits), default=None
                ),
                "device": r.environment.device_name,
                "device_kind": r.environment.device_kind,
                "dtype": r.environment.dtype,
                "threads": r.environment.threads,
                "torch": r.environment.torch_version,
                "dataset": r.data.dataset,
                "data_dir": r.data.data_dir,
                "synthetic": r.data.synthetic,
                "variant": r.config.get("model", {}).get("variant"),
                "error": r.error or (r.oom.message if r.oom else None),
                "created_at": r.created_at,
            }
        )
    columns = ["file", "name", "kind", "status", "batch_size", "checkpointing", "policy"]
    return pd.DataFrame(rows, columns=columns if not rows else None)


def memory_frame(df) -> Any:
    """Successful memory runs, sorted by batch size then checkpointing."""
    if df.empty:
        return df
    ok = df[(df["kind"] == MEMORY) & (df["status"] == "ok")]
    return ok.sort_values(["batch_size", "checkpointing"]).reset_index(drop=True)


def comparison_frame(df) -> Any:
    """Per batch size with both a baseline and a (full-policy) checkpointed run: the memory
    reduction and the step-time overhead of checkpointing, in percent."""
    import pandas as pd

    mem = memory_frame(df)
    rows = []
    if not mem.empty:
        for b, group in mem.groupby("batch_size"):
            base = group[~group["checkpointing"]]
            ckpt = group[group["checkpointing"] & group["policy"].isin(["full", None])]
            if base.empty or ckpt.empty:
                continue
            b0, c0 = base.iloc[0], ckpt.iloc[0]
            rows.append(
                {
                    "batch_size": int(b),
                    "baseline_allocated_mib": b0["peak_allocated_mib"],
                    "checkpointed_allocated_mib": c0["peak_allocated_mib"],
                    "allocated_reduction_pct": _pct_less(
                        b0["peak_allocated_mib"], c0["peak_allocated_mib"]
                    ),
                    "baseline_reserved_mib": b0["peak_reserved_mib"],
                    "checkpointed_reserved_mib": c0["peak_reserved_mib"],
                    "reserved_reduction_pct": _pct_less(
                        b0["peak_reserved_mib"], c0["peak_reserved_mib"]
                    ),
                    "baseline_step_s": b0["mean_step_s"],
                    "checkpointed_step_s": c0["mean_step_s"],
                    "step_time_overhead_pct": _pct_more(b0["mean_step_s"], c0["mean_step_s"]),
                }
            )
    return pd.DataFrame(
        rows,
        columns=[
            "batch_size",
            "baseline_allocated_mib",
            "checkpointed_allocated_mib",
            "allocated_reduction_pct",
            "baseline_reserved_mib",
            "checkpointed_reserved_mib",
            "reserved_reduction_pct",
            "baseline_step_s",
            "checkpointed_step_s",
            "step_time_overhead_pct",
        ],
    )


def _pct_less(base, new):
    return None if base is None or new is None or not base else 100.0 * (base - new) / base


def _pct_more(base, new):
    return None if base is None or new is None or not base else 100.0 * (new - base) / base


def parity_frame(reports) -> Any:
    """One row per parity report and comparison (checkpointed vs baseline, repeat vs baseline)."""
    import pandas as pd

    rows = []
    for _, r in reports:
        if r.kind != PARITY or r.status != "ok" or r.parity is None:
            continue
        for which, c in (
            ("checkpointed vs baseline", r.parity.checkpointed_vs_baseline),
            ("repeat vs baseline", r.parity.repeat_vs_baseline),
        ):
            rel = [g.rel_l2 for g in c.gradients]
            rows.append(
                {
                    "report": r.name,
                    "deterministic": r.parity.deterministic,
                    "comparison": which,
                    "outputs_equal": f"{sum(o.equal for o in c.outputs)}/{c.num_outputs}",
                    "outputs_max_abs_diff": max((o.max_abs_diff for o in c.outputs), default=0.0),
                    "loss_equal": c.loss.equal,
                    "loss_abs_diff": c.loss.max_abs_diff,
                    "gradients_equal": f"{sum(bool(g.equal) for g in c.gradients)}/{c.num_gradients}",
                    "grad_rel_l2_max": max(rel, default=0.0),
                    "grad_rel_l2_median": float(sorted(rel)[len(rel) // 2]) if rel else 0.0,
                    "grad_max_abs_diff": max((g.max_abs_diff for g in c.gradients), default=0.0),
                }
            )
    return pd.DataFrame(rows)


def step_frame(report) -> Any:
    """The per-step table of one memory report."""
    import pandas as pd

    rows = []
    for st in report.steps:
        rows.append(
            {
                "step": st.step,
                "counted": st.counted,
                "events": len(st.event_indices),
                "max_hits": max(st.hits) if st.hits else None,
                "max_padded_hits": max(st.padded_hits) if st.padded_hits else None,
                "time_s": st.time_s,
                "peak_allocated_mib": st.peak_allocated_mib,
                "peak_reserved_mib": st.peak_reserved_mib,
                "loss_total": st.loss.get("total"),
            }
        )
    return pd.DataFrame(rows)


def measured_hits(reports) -> list[int]:
    """Hits of every event used in a counted step of a memory report (repeats included)."""
    hits: list[int] = []
    for _, r in reports:
        if r.kind == MEMORY:
            for st in r.steps:
                if st.counted:
                    hits.extend(st.hits)
    return hits


def data_used(df) -> list[dict[str, Any]]:
    """The distinct (data_dir, dataset, synthetic) of the reports."""
    if df.empty:
        return []
    cols = ["data_dir", "dataset", "synthetic"]
    return df[cols].drop_duplicates().to_dict("records")


def study_statement(df, description: str = "", notes: list[str] | tuple[str, ...] = ()) -> str:
    """Markdown: the device, the data (generated or real), the steps per run, and that these are
    smoke measurements."""
    if df.empty:
        return "No reports were found in this directory: nothing to summarise."
    lines = []
    if description:
        lines += [description.strip(), ""]
    devices = df[["device", "device_kind", "dtype", "threads", "torch"]].drop_duplicates()
    for d in devices.to_dict("records"):
        lines.append(
            f"- **Device:** {d['device']} ({d['device_kind']}), {d['dtype']}, "
            f"{d['threads']} threads, PyTorch {d['torch']}."
        )
    for d in data_used(df):
        kind = (
            "synthetic (generated by `heptstudy data generate`, not real detector data)"
            if d["synthetic"]
            else "real"
        )
        lines.append(f"- **Data:** {d['dataset']} in `{d['data_dir']}`: {kind}.")
    mem = df[(df["kind"] == MEMORY) & df["counted_steps"].notna()]
    if not mem.empty:
        pairs = (
            mem[["counted_steps", "warmup_steps"]]
            .drop_duplicates()
            .astype(int)
            .to_records(index=False)
        )
        desc = "; ".join(f"{c} counted step(s) after {w} warm-up step(s)" for c, w in pairs)
        lines.append(f"- **Steps per memory run:** {desc}.")
        if any(c < 5 for c, _ in pairs):
            lines.append(
                "  Fewer than the 5 counted + 2 warm-up steps of the GPU protocol: one full-size step "
                "takes tens of seconds on CPU, and the whole CPU matrix has to fit in about 30 minutes."
            )
    lines += [f"- {n}" for n in notes]
    lines += ["", f"**{SMOKE_STATEMENT}**"]
    return "\n".join(lines)


def hits_stats_for(df, split: str = "train") -> dict[str, Any] | None:
    """Hits-per-event statistics (:func:`heptstudy.data.stats.hits_stats`) of the data set the
    memory reports used; ``None`` when it cannot be opened (the reports still say what it was)."""
    from heptstudy.data.stats import hits_stats

    mem = df[df["kind"] == MEMORY] if not df.empty else df
    if mem.empty:
        return None
    row = mem.iloc[0]
    name, configs = row["dataset"], ["1"]
    try:
        from heptstudy.config import load_config

        configs = list(load_config(overrides=[]).data.configs)
    except Exception:  # noqa: BLE001
        pass
    for _, r in mem.iterrows():
        if r.get("data_dir"):
            try:
                return hits_stats(r["data_dir"], name, configs, split)
            except Exception:  # noqa: BLE001 - data moved or deleted since the run
                continue
    return None


def figure_tag(df) -> str:
    """A short label for figures: device, dtype and whether the data are synthetic."""
    if df.empty:
        return ""
    devices = ", ".join(
        sorted(
            {
                f"{d} ({k}, {t})"
                for d, k, t in df[["device", "device_kind", "dtype"]].itertuples(index=False)
            }
        )
    )
    synth = set(df["synthetic"])
    data = (
        "synthetic data"
        if synth == {True}
        else "real data"
        if synth == {False}
        else "synthetic and real data"
    )
    return f"{devices}; {data}; smoke measurement"


_RUN_COLUMNS = {
    "name": "run",
    "status": "status",
    "batch_size": "batch",
    "checkpointing": "checkpointing",
    "peak_allocated_mib": "peak allocated [MiB]",
    "peak_reserved_mib": "peak reserved [MiB]",
    "mean_step_s": "mean step [s]",
    "counted_steps": "counted steps",
    "max_padded_hits": "max padded hits/event",
    "error": "error",
}


def runs_table(df) -> Any:
    """The runs of an experiments directory, as shown in the report."""
    if df.empty:
        return df
    cols = [c for c in _RUN_COLUMNS if c in df.columns]
    df = df.sort_values(["kind", "batch_size", "checkpointing", "name"]).reset_index(drop=True)
    table = df[cols].rename(columns=_RUN_COLUMNS)
    if not table["error"].notna().any():
        table = table.drop(columns="error")
    return table.round(2)


def comparison_table(comp) -> Any:
    names = {
        "batch_size": "batch",
        "baseline_allocated_mib": "allocated off [MiB]",
        "checkpointed_allocated_mib": "allocated on [MiB]",
        "allocated_reduction_pct": "allocated reduction [%]",
        "baseline_reserved_mib": "reserved off [MiB]",
        "checkpointed_reserved_mib": "reserved on [MiB]",
        "reserved_reduction_pct": "reserved reduction [%]",
        "baseline_step_s": "step off [s]",
        "checkpointed_step_s": "step on [s]",
        "step_time_overhead_pct": "step-time overhead [%]",
    }
    return comp.rename(columns=names).round(1)


def memory_definitions(reports) -> str:
    """Markdown: how 'allocated' and 'reserved' were measured on the devices of the reports."""
    seen: dict[tuple, str] = {}
    for _, r in reports:
        s = r.summary
        if r.kind == MEMORY and s is not None:
            key = (r.environment.device_kind, s.allocated_definition, s.reserved_definition)
            seen[key] = s.tracked_memory_note or ""
    lines = []
    for (kind, alloc, res), note in seen.items():
        lines.append(f"- **{kind}**: *allocated* = {alloc}; *reserved* = {res or 'not available'}.")
        if note:
            lines.append(f"  {note}")
    lines.append(
        "- Memory is the peak over forward, loss and backward of each step, maximum over the counted "
        "steps; not step-end occupancy."
    )
    return "\n".join(lines)


def hits_statement(stats: dict[str, Any]) -> str:
    q = stats["total"]["quantiles"]
    kind = "synthetic (generated)" if stats["synthetic"] else "real"
    return (
        f"{stats['num_events']} {kind} events of `{stats['dataset']}` ({stats['split']} split): "
        f"{stats['total']['min']:,} to {stats['total']['max']:,} hits per event, median {q['p50']:,.0f}, "
        f"95% below {q['p95']:,.0f}; {stats['events_above_tail_threshold']} events above "
        f"{stats['tail_threshold']:,} hits."
    )


def optional_fit_figure(reports, tag: str = "") -> tuple[Any, Any, str]:
    """The fitted memory lines of :mod:`heptstudy.fitting` over the successful memory reports:
    ``(figure, table, "")``, or ``(None, None, why)`` when there is no fit to draw (module
    missing, too few reports, a fit that fails): the aggregate section is then skipped."""
    import pandas as pd

    paths = [p for p, r in reports if r.kind == MEMORY and r.status == "ok"]
    if len({r.batch_size for p, r in reports if r.kind == MEMORY and r.status == "ok"}) < 2:
        return None, None, "fewer than two batch sizes with successful memory reports"
    try:
        from heptstudy.fitting.memmodel import fit_reports
        from heptstudy.fitting.plots import fit_figure, fit_table
    except ImportError as err:
        return None, None, f"the memory model is not available ({err})"
    try:
        models = fit_reports(paths)
    except Exception as err:  # noqa: BLE001 - too few points for a fit is a result, not a crash
        return None, None, f"no memory model could be fitted: {str(err).splitlines()[0]}"
    synthetic = any(r.data.synthetic for _, r in reports)
    fig = fit_figure(models, synthetic=synthetic)
    if tag:
        fig.axes[0].text(
            0.02,
            0.98,
            tag,
            transform=fig.axes[0].transAxes,
            ha="left",
            va="top",
            fontsize=9,
            color="0.3",
        )
    return fig, pd.DataFrame(fit_table(models)), ""


# --------------------------------------------------------------------------------------------
# Pipeline helpers
# --------------------------------------------------------------------------------------------


def fresh_output_dir(path: str | os.PathLike) -> Path:
    """An empty training output directory: an earlier pipeline run there (recognised by its
    ``config.yaml`` or ``metrics.jsonl``) is removed; anything else is refused."""
    import shutil

    path = Path(path)
    if path.exists() and any(path.iterdir()):
        if not ((path / "config.yaml").exists() or (path / "metrics.jsonl").exists()):
            raise StudyError(
                f"{path} exists and does not look like a training output directory; "
                "choose another out_dir or empty it yourself"
            )
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def read_metrics(path: str | os.PathLike) -> Any:
    """``metrics.jsonl`` of a training run as a DataFrame (train and validation records)."""
    import json

    import pandas as pd

    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    df = pd.DataFrame(rows)
    return df.drop(columns=[c for c in ("event_index_by_rank",) if c in df.columns])


def compare_resume(original, resumed) -> Any:
    """Training losses of the steps a resumed run repeated, next to the original run's."""
    import pandas as pd

    a = original[original["kind"] == "train"].set_index("step")
    b = resumed[resumed["kind"] == "train"].set_index("step")
    steps = [s for s in b.index if s in a.index]
    cols = [c for c in b.columns if c.startswith("loss_")]
    rows = []
    for s in steps:
        for c in cols:
            rows.append(
                {
                    "step": s,
                    "loss": c.removeprefix("loss_"),
                    "original": a.at[s, c],
                    "resumed": b.at[s, c],
                    "equal": bool(a.at[s, c] == b.at[s, c]),
                }
            )
    return pd.DataFrame(rows, columns=["step", "loss", "original", "resumed", "equal"])


# --------------------------------------------------------------------------------------------
# Explore: one training step's memory over time
# --------------------------------------------------------------------------------------------


def step_memory_timeline(config, batch, device=None) -> Any:
    """Run one training step (forward, loss, backward) of a freshly seeded model under the storage
    tracker and return its :class:`~heptstudy.measure.memory.StepMemory` (``.timeline`` of
    (op index, live bytes), ``.marks``). The optimizer update is not tracked."""
    import torch

    from heptstudy.measure.memory import make_meter
    from heptstudy.measure.parity import build_seeded
    from heptstudy.train.optim import build_optimizer
    from heptstudy.train.trainer import autocast_dtype, forward_and_loss

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    batch = {k: v.to(device) for k, v in batch.items()}
    model = build_seeded(config, device)
    model.train()
    optimizer = build_optimizer(model, config.train)
    meter = make_meter(device, track_categories=True)
    meter.start_step(batch.values(), model=model, optimizer=optimizer)
    meter.mark("forward")
    _, losses = forward_and_loss(model, batch, config, autocast_dtype(config, device))
    meter.mark("backward")
    losses["total"].backward()
    return meter.stop_step()


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _cmd_run(args: argparse.Namespace) -> int:
    results = run_study(
        args.matrix,
        args.out,
        force=args.force,
        figures_dir=args.figures,
        data_dir=args.data_dir,
        progress=not args.no_progress,
        aggregate=not args.no_aggregate,
    )
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    print("runs: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    if not args.no_aggregate:
        print(f"report: {Path(args.out) / 'report.html'}")
    return 0


def _cmd_aggregate(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if not out.is_dir():
        raise StudyError(f"{out} is not a directory of reports; run `heptstudy study run` first")
    html = aggregate_study(out, args.figures or Path("figures") / out.name)
    print(f"report: {html}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    m = load_matrix(args.matrix)
    for run in m.runs:
        print(f"{run.name:<28} {run.notebook}.ipynb  {run.parameters}")
    return 0


def register_cli(subparsers) -> None:
    study = subparsers.add_parser(
        "study", help="run a study matrix of notebooks; aggregate; HTML report"
    )
    sub = study.add_subparsers(dest="study_command", required=True)
    run = sub.add_parser(
        "run", help="every measurement of a matrix in its own kernel, then the report"
    )
    run.add_argument(
        "--matrix", required=True, help="study matrix YAML, e.g. configs/study/cpu_default.yaml"
    )
    run.add_argument(
        "--out", required=True, help="experiments directory, e.g. experiments/cpu_reference"
    )
    run.add_argument("--force", action="store_true", help="rerun measurements whose report exists")
    run.add_argument("--figures", help="figures directory (default figures/<name of --out>)")
    run.add_argument(
        "--data-dir",
        help="TFDS data directory of every run (default: the matrix's, else data/tfds)",
    )
    run.add_argument("--no-aggregate", action="store_true", help="only the measurements")
    run.add_argument("--no-progress", action="store_true")
    run.set_defaults(func=_cmd_run)
    agg = sub.add_parser(
        "aggregate", help="aggregate.ipynb and report.html of an experiments directory"
    )
    agg.add_argument("--out", required=True, help="experiments directory holding the JSON reports")
    agg.add_argument("--figures", help="figures directory (default figures/<name of --out>)")
    agg.set_defaults(func=_cmd_aggregate)
    check = sub.add_parser("check", help="validate a study matrix and list its runs")
    check.add_argument("--matrix", required=True)
    check.set_defaults(func=_cmd_check)


__all__ = [
    "ConfigError",
    "Matrix",
    "NotebookParameterError",
    "Run",
    "RunResult",
    "StudyError",
    "aggregate_study",
    "comparison_frame",
    "load_matrix",
    "load_reports",
    "memory_options",
    "parity_frame",
    "parity_options",
    "pipeline_config",
    "render_html",
    "reports_frame",
    "run_study",
    "step_frame",
    "step_memory_timeline",
    "study_statement",
]
