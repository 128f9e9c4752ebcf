"""Running a matrix: every measurement its own Papermill execution in a fresh kernel.

:func:`run_study` (``heptstudy study run --matrix FILE --out DIR``) executes
``notebooks/memory.ipynb`` or ``notebooks/parity.ipynb`` once per run; the executed notebooks are
kept; existing reports are skipped unless ``force``; a run that runs out of memory or whose kernel
dies is recorded as a report with status ``oom``/``error``. Then ``notebooks/aggregate.ipynb`` is
executed and rendered with ``jupyter nbconvert --to html --no-input`` into ``DIR/report.html``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heptstudy.atomic import atomic_path, atomic_write_text
from heptstudy.study.common import NOTEBOOKS, StudyError, notebooks_dir
from heptstudy.study.matrix import Matrix, Run, load_matrix


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
    from heptstudy.measure.bench import report_header

    request = run.request(output=str(report_path), progress=False)
    config, device = request.config(), request.device
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
        kind=request.kind,
        status=status,
        error=text[:2000],
        **report_header(
            request,
            config,
            fresh_process=True,
            synthetic=synthetic,
            notes=[
                *notes,
                f"recorded by heptstudy study run: {run.notebook}.ipynb did not write a report",
            ],
        ),
    )
    if status == "oom":
        fields["oom"] = rp.OomInfo(
            message=text.splitlines()[0][:500],
            batch_size=request.batch_size,
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
    atomic_write_text(out / "matrix.yaml", matrix.path.read_text())
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
    # nbconvert opens the output file itself, so it is pointed at the temporary one.
    with atomic_path(html, suffix=".html") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "jupyter",
            "nbconvert",
            "--to",
            "html",
            "--no-input",
            "--output-dir",
            str(tmp.parent.resolve()),
            "--output",
            tmp.stem,
            str(notebook),
        ]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise StudyError(
                f"rendering {notebook} to HTML failed ({' '.join(cmd)}):\n{res.stderr[-2000:]}"
            )
    return html
