"""Running a matrix: every measurement its own Papermill execution in a fresh kernel."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager
from jupyter_core.paths import jupyter_runtime_dir

from heptstudy.atomic import atomic_path, atomic_write_text, remove_leftovers
from heptstudy.data.batching import dataset_for
from heptstudy.errors import HeptstudyError, Interrupted
from heptstudy.fingerprint import digest
from heptstudy.locks import holding_all
from heptstudy.measure import report as rp
from heptstudy.measure.bench import check_enough_events, report_header
from heptstudy.measure.paired import paired_plans
from heptstudy.meters.allocator import AllocatorState, allocator_in_use, environment_with
from heptstudy.names import inside
from heptstudy.paths import ROOT, real_path
from heptstudy.study.common import NOTEBOOKS, PAIRED, StudyError
from heptstudy.study.matrix import Matrix, load_matrix
from heptstudy.study.outputs import (
    PENDING,
    REPORT_PAGE,
    StudyFolders,
    Superseded,
    check_writable,
    refuse_foreign_outputs,
    replace_with_pending,
    shown,
    study_folders,
)
from heptstudy.study.resume import report_status, resumable, run_identity, stamp
from heptstudy.study.schedule import DEFAULT, Execution, report_files, schedule

#: Kernels this process started, for Ctrl-C to stop (own sessions: the terminal's misses them).
_KERNELS: weakref.WeakSet = weakref.WeakSet()


# Unix sockets in the 0700 runtime folder: no plain-TCP warning in every notebook's log.
class LocalKernelManager(KernelManager):
    def __init__(self, **kwargs: Any) -> None:
        runtime = Path(jupyter_runtime_dir())
        runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
        # socket paths are limited to about 100 bytes: a short name
        ip = str(runtime / f"hs-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        super().__init__(transport="ipc", ip=ip, **kwargs)
        _KERNELS.add(self)


def _stop_kernels(execution: threading.Thread, grace_s: float = 3.0) -> None:
    """SIGTERM every kernel's process group (a starting kernel would print a traceback for
    SIGINT; results are written atomically); one still running after ``grace_s`` is killed."""
    pids = [getattr(km.provisioner, "pid", None) for km in list(_KERNELS)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError, TypeError):
                os.killpg(pid, sig)
        execution.join(grace_s)
        if not execution.is_alive():
            return


def execute_notebook(input_path: str | os.PathLike, output_path: str | os.PathLike, **kwargs):
    """:func:`papermill.execute_notebook` with its kernel on Unix sockets, writing a temporary
    file (papermill rewrites it after every cell) that replaces ``output_path`` once whole: a
    kill mid-way leaves the previous notebook; one that ran to a failing cell is put in place,
    then raised. Papermill runs in a thread, so Ctrl-C stops the kernel and ends the call at
    once (papermill's own handler would leave the cell waiting)."""
    import papermill as pm

    kwargs.setdefault("kernel_manager_class", LocalKernelManager)
    done: dict[str, Any] = {}

    def execute(tmp: Path) -> None:
        try:
            done["notebook"] = pm.execute_notebook(str(input_path), str(tmp), **kwargs)
        except BaseException as err:  # noqa: BLE001 - handed to the calling thread
            done["error"] = err

    with atomic_path(output_path, suffix=".ipynb") as tmp:
        execution = threading.Thread(target=execute, args=(tmp,), daemon=True)
        execution.start()
        try:
            while execution.is_alive():
                execution.join(0.2)  # a bare join() would not see Ctrl-C
        except KeyboardInterrupt:
            _stop_kernels(execution)
            raise
        failure = done.get("error")
        if failure is None:
            return done["notebook"]
        if not isinstance(failure, Exception) or tmp.stat().st_size == 0:
            raise failure  # refused before it wrote anything
    raise failure


@dataclass
class RunResult:
    name: str
    status: str  # "ok", "oom", "error", "skipped" (resumed: its report has the run's fingerprint)
    report: Path
    label: str
    seconds: float = 0.0
    message: str = ""


@dataclass
class StudyRun:
    folders: StudyFolders
    results: list[RunResult] = field(default_factory=list)
    report_html: Path | None = None
    superseded: Path | None = None  # the folder replaced results were moved to, if any


def _papermill(
    notebook: str, output: Path, parameters: dict, timeout: int | None, progress: bool = False
) -> None:
    options = dict(kernel_name="python3", progress_bar=progress, execution_timeout=timeout)
    input_nb = ROOT / "notebooks" / notebook
    execute_notebook(input_nb, output, parameters=parameters, cwd=str(ROOT), **options)


def _failure_report(notebook: str, m, err: BaseException) -> str:
    """Write a report saying why a run produced none: out of memory, a dead kernel, an error."""
    import torch
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    # a cell's exception arrives as its class name (papermill's ename), others as themselves
    ename = getattr(err, "ename", type(err).__name__)
    evalue = getattr(err, "evalue", str(err))
    text = f"{ename}: {evalue}".strip()
    status, notes = "error", []
    if ename == "OutOfMemoryError" or isinstance(err, torch.OutOfMemoryError):
        status = "oom"
    elif isinstance(err, DeadKernelError):
        text = (
            f"the kernel died during the run ({type(err).__name__}: {str(err).strip()[:200]}); "
            "on CPU this is most often the kernel being killed for lack of host memory"
        )
        notes.append(
            "kernel died: no measurement; the executed notebook shows the last cell reached"
        )
    elif isinstance(err, (CellTimeoutError, TimeoutError)):
        text = f"a cell ran past the matrix's cell_timeout_s ({type(err).__name__}: {str(err).strip()[:200]})"
    synthetic = False
    with contextlib.suppress(Exception):  # the data set itself may be what failed
        synthetic = bool(dataset_for(m.config, "train").metadata.get("synthetic", False))
    # what the kernel's measurement would have applied (it did not get to say itself)
    allocator = AllocatorState(allocator_in_use().name, dict(m.allocator))
    notes.append(f"recorded by heptstudy study run: {notebook} did not write a report")
    header = report_header(
        m, fresh_process=True, synthetic=synthetic, allocator=allocator, notes=notes
    )
    fields: dict[str, Any] = dict(kind=m.request.kind, status=status, error=text[:2000], **header)
    if status == "oom":
        cuda = m.device.type == "cuda"
        total = torch.cuda.get_device_properties(m.device).total_memory if cuda else None
        fields["oom"] = rp.OomInfo(
            message=text.splitlines()[0][:500],
            batch_size=m.batch_size,
            padded_hits=[],
            device_memory_bytes=total,
        )
    rp.write_report(rp.BenchReport(**fields), m.report_path)
    return text


@dataclass
class Prepared:
    execution: Execution
    measurement: Any  # heptstudy.measure.request.Measurement
    fingerprint: str
    identity: dict[str, Any]


def prepare(matrix: Matrix) -> list[Prepared]:
    """Check every execution; one :class:`StudyError` names every run that cannot be measured."""
    prepared, problems, checked = [], {}, set()
    for ex in schedule(matrix.runs):
        if ex.name in problems:  # said once, not once per round
            continue
        try:
            # from the repository, as the kernel: identity and report agree on train.out_dir
            before = Path.cwd()
            os.chdir(ROOT)
            try:
                m = ex.run.request(progress=False, parameters=ex.parameters).resolve()
            finally:
                os.chdir(before)
            if ex.name not in checked:
                checked.add(ex.name)
                check_enough_events(m)
            identity = run_identity(m)
            if ex.run.notebook == PAIRED:  # its plans are the model's to name
                plans = [p.name for p in paired_plans(ex.run.parameters["plans"], m)]
                identity["paired"] = {"plans": plans, "rounds": ex.run.parameters["rounds"]}
        except HeptstudyError as err:
            problems[ex.name] = f"{ex.name}: {err}"
            continue
        prepared.append(Prepared(ex, m, digest(identity)[:20], identity))
    if problems:
        raise StudyError(
            f"study matrix {shown(matrix.path)}: {len(problems)} run(s) cannot be measured, so "
            "nothing was measured or changed:\n  " + "\n  ".join(problems.values())
        )
    return prepared


@contextlib.contextmanager
def _no_allocator_settings():
    """Kernels started inside inherit no allocator variable (``allocator: default``)."""
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(environment_with({}, saved))
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_one(
    prep: Prepared, out: Path, superseded: Superseded, force: bool, timeout: int | None
) -> RunResult:
    """One execution, written under ``out/.pending`` first and put in place once it exists."""
    ex = prep.execution
    final = inside(out, ex.report, f"run {ex.name!r}: report")
    nb_final = inside(out, ex.notebook, f"run {ex.name!r}: executed notebook")
    why = ""
    if final.exists() and not force:
        resume, why = resumable(final, prep.fingerprint, prep.identity)
        if resume:
            return RunResult(ex.name, "skipped", final, ex.label, message=why)
    elif final.exists():
        why = "--force: measuring again"
    pending, nb_pending = out / PENDING / ex.report, out / PENDING / ex.notebook
    for stale, suffix in ((pending, ".tmp"), (nb_pending, ".ipynb")):
        superseded.move_aside(stale)  # left by an interrupted study: kept, not reused
        remove_leftovers(stale, suffix)  # half-written by a killed kernel: nothing to keep
        stale.parent.mkdir(parents=True, exist_ok=True)
    parameters = {**ex.parameters, "output": shown(pending)}
    notebook = NOTEBOOKS[ex.run.notebook]
    t0 = time.perf_counter()
    message, failure = why, None
    try:
        # else the measurement applies its platform's allocator settings itself
        with _no_allocator_settings() if ex.run.allocator == DEFAULT else contextlib.nullcontext():
            _papermill(notebook, nb_pending, parameters, timeout)
    except Exception as err:  # noqa: BLE001 - an OOM or a dead kernel is a result, not a crash
        failure = err
        if pending.exists():  # the notebook wrote its report, then something later failed
            message = f"report written, then: {type(err).__name__}"
    if not pending.exists():
        if failure is None:
            failure = RuntimeError("the notebook finished without writing a report")
        text = _failure_report(notebook, replace(prep.measurement, report_path=pending), failure)
        message = text.splitlines()[0][:200]
    seconds = time.perf_counter() - t0
    note = stamp(pending, prep.fingerprint, prep.identity)
    status = report_status(pending)
    replace_with_pending(pending, final, superseded)
    if nb_pending.exists():
        replace_with_pending(nb_pending, nb_final, superseded)
    message = "; ".join(m for m in (message, note) if m)
    return RunResult(ex.name, status, final, ex.label, seconds, message)


def run_study(
    matrix_path: str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    *,
    force: bool = False,
    figures_dir: str | os.PathLike | None = None,
    reference: str | None = None,
    progress: bool = True,
    aggregate: bool = True,
    data_dir: str | os.PathLike | None = None,
) -> StudyRun:
    """Every run of the matrix in its rounds, then ``aggregate.ipynb`` and ``report.html``."""
    from tqdm.auto import tqdm

    matrix = load_matrix(matrix_path, data_dir=str(data_dir) if data_dir else None)
    folders = study_folders(out_dir, figures_dir, reference)
    if aggregate:  # before the minutes of measuring, not after them
        refuse_foreign_outputs(folders.out)
    prepared = prepare(matrix)
    out = folders.out
    check_writable(out, out / "notebooks", out / PENDING, folders.figures)
    # one study at a time in a folder: a second one would move the first one's results aside
    with holding_all((out, "study folder (--out)"), (folders.figures, "figures folder")):
        superseded = Superseded(out)
        done = StudyRun(folders)
        _move_aside_foreign(out, {out / p.execution.report for p in prepared}, superseded)
        copy = out / "matrix.yaml"
        text = matrix.path.read_text()
        if copy.exists() and copy.read_text() != text:
            superseded.move_aside(copy)
        atomic_write_text(copy, text)
        bar = tqdm(
            prepared, desc=f"study {matrix.name}", unit="run", disable=not progress, file=sys.stdout
        )
        for prep in bar:
            bar.set_postfix_str(prep.execution.label)
            try:
                result = run_one(prep, out, superseded, force, matrix.cell_timeout_s)
            except KeyboardInterrupt:
                bar.close()
                _remove_empty(out / PENDING)
                finished = (
                    f"{len(done.results)} of {len(prepared)} runs finished and are kept in "
                    f"{shown(out)}/"
                    if done.results
                    else f"none of the {len(prepared)} runs had finished"
                )
                raise Interrupted(
                    f"{finished}; {prep.execution.label} was stopped with its kernel and nothing "
                    "of it kept; run the same command again to go on (finished runs are resumed)"
                ) from None
            done.results.append(result)
            line = f"{result.label:<44} {result.status:<8}"
            line += f" {result.seconds:7.1f} s" if result.status != "skipped" else ""
            line += f"  {result.message}" if result.message else ""
            (bar.write if progress else print)(line)
        bar.close()
        _remove_empty(out / PENDING)
        if aggregate:
            try:
                done.report_html = aggregate_study(
                    out, folders.figures, matrix=matrix, progress=progress
                )
            except KeyboardInterrupt:
                raise Interrupted(
                    f"all {len(prepared)} runs are finished and kept in {shown(out)}/; the "
                    "report was not remade (the previous aggregate.ipynb and report.html are "
                    "kept); run the same command again to make it (the runs are resumed)"
                ) from None
        done.superseded = superseded.folder if superseded.moved else None
        return done


def _move_aside_foreign(out: Path, expected: set[Path], superseded: Superseded) -> None:
    """Reports of runs not in this matrix go aside: the report shows this matrix only."""
    foreign = []
    for path in report_files(out, paired=True):
        if path not in expected:
            rel = path.relative_to(out)
            superseded.move_aside(path)
            superseded.move_aside(out / "notebooks" / rel.with_suffix(".ipynb"))
            foreign.append(str(rel))
    if foreign:
        print(
            f"moved {len(foreign)} report(s) of runs not in this matrix to "
            f"{shown(superseded.folder)}/: {', '.join(foreign)}"
        )


def _remove_empty(folder: Path) -> None:
    subs = sorted((p for p in folder.rglob("*") if p.is_dir()), reverse=True)
    for sub in [*subs, folder] if folder.is_dir() else ():
        with contextlib.suppress(OSError):
            sub.rmdir()


def aggregate_study(
    out_dir: str | os.PathLike,
    figures_dir: str | os.PathLike,
    *,
    matrix: Matrix | None = None,
    progress: bool = False,
) -> Path:
    out, figures = real_path(out_dir, "--out"), real_path(figures_dir, "--figures")
    refuse_foreign_outputs(out)
    executed = out / "aggregate.ipynb"
    # relative paths: the report shows no absolute path of this machine
    parameters = {
        "experiments_dir": shown(out),
        "figures_dir": shown(figures),
        "title": f"Activation checkpointing in HEPTv2: {matrix.name if matrix else out.name}",
        "description": matrix.description if matrix else "",
        "notes": list(matrix.notes) if matrix else [],
    }
    before = {}  # path -> (inode, mtime) of the tables and figures, to tell which are written again
    for folder, pattern in ((out, "*.csv"), (figures, "*.png"), (figures, "*.pdf")):
        for p in folder.glob(pattern):
            st = p.stat()
            before[p] = (st.st_ino, st.st_mtime_ns)
    remove_leftovers(executed, ".ipynb")  # of an aggregate that was killed
    timeout = matrix.cell_timeout_s if matrix else None
    # minutes on a full study (the fits, the estimates): a bar of its cells
    _papermill("aggregate.ipynb", executed, parameters, timeout, progress)
    html = render_html(executed, out / "report.html")
    # move aside the tables and figures of an earlier aggregate that this one did not write
    superseded = Superseded(out)
    stale = []
    for path, seen in before.items():
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        if (st.st_ino, st.st_mtime_ns) != seen:
            continue  # written again (atomic writes replace the file)
        superseded.move_aside(path)
        stale.append(path.name)
    if stale:
        print(
            f"moved {len(stale)} table(s)/figure(s) the aggregate no longer writes to "
            f"{shown(superseded.folder)}/: {', '.join(sorted(stale))}"
        )
    return html


def render_html(notebook: str | os.PathLike, html: str | os.PathLike) -> Path:
    """``jupyter nbconvert --to html --no-input``: figures are embedded in the page."""
    notebook, html = Path(notebook), Path(html)
    # nbconvert opens the output file itself, so it is pointed at the temporary one.
    with atomic_path(html, suffix=".html", kind=REPORT_PAGE) as tmp:
        cmd = [sys.executable, *"-m jupyter nbconvert --to html --no-input".split()]
        cmd += ["--output-dir", str(tmp.parent.resolve()), "--output", tmp.stem, str(notebook)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise StudyError(
                f"rendering {notebook} to HTML failed ({' '.join(cmd)}):\n{res.stderr[-2000:]}"
            )
    return html
