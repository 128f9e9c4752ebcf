"""The study runner without notebook kernels: where a study writes, when it resumes, that it never
loses a result, that bad input stops it before anything runs; the allocator and host-usage
records of a report; the rounds and the overhead over them; the flag on system-time-dominated
pairs. The kernel launch is replaced by the same measurement run in this process (tiny model);
the end-to-end study through ``make study`` is in tests/test_make_study.py."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pandas as pd
import papermill
import pytest
import yaml
from nbclient.exceptions import DeadKernelError
from papermill.exceptions import PapermillExecutionError

from heptstudy import study
from heptstudy.errors import HeptstudyError
from heptstudy.measure.report import read_report, write_report
from heptstudy.meters import allocator as alloc
from heptstudy.meters.host_usage import HostUsage
from heptstudy.study.common import StudyError
from heptstudy.study.schedule import Execution, locate, schedule
from tests.conftest import TINY_MODEL, tiny_request

ROOT = Path(__file__).resolve().parent.parent


def _kernel_in_process(monkeypatch):
    """Replace papermill's execution (the kernel) by the notebook's own two calls, run here
    (tiny model)."""
    from heptstudy.measure.bench import run_bench
    from heptstudy.measure.request import MeasurementRequest

    launched = []

    def kernel(input_path, output_path, parameters, cwd, **_):
        kind = "parity" if Path(input_path).name == "parity.ipynb" else "memory"
        launched.append(parameters)
        params = {k: v for k, v in parameters.items() if k != "output"}
        output = Path(parameters["output"])
        output = output if output.is_absolute() else Path(cwd) / output
        request = MeasurementRequest.build(kind=kind, output=str(output), progress=False, **params)
        run_bench(request.resolve())
        nbformat.write(nbformat.v4.new_notebook(), str(output_path))

    monkeypatch.setattr(papermill, "execute_notebook", kernel)
    return launched


#: One timed run (no memory pass: the runner does not care what is measured, and it is fast).
ONE = [{"batch_size": 2, "checkpointing": False, "passes": "timing"}]
TWO = [*ONE, {"batch_size": 2, "checkpointing": True, "passes": "timing"}]


def _matrix(tmp_path, data_dir, runs=None, name="m.yaml", **top):
    matrix = {
        "name": "t",
        "defaults": {
            "data_dir": str(data_dir),
            "steps": 1,
            "warmup": 1,
            "overrides": list(TINY_MODEL),
        },
        "runs": runs or ONE,
        **top,
    }
    path = tmp_path / name
    path.write_text(yaml.safe_dump(matrix))
    return path


def _bytes(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_resume_only_with_the_same_fingerprint(tiny_data_dir, tmp_path, monkeypatch):
    launched = _kernel_in_process(monkeypatch)
    path, out = _matrix(tmp_path, tiny_data_dir, TWO), tmp_path / "study"
    first = study.run_study(path, out, progress=False, aggregate=False).results
    assert [r.status for r in first] == ["ok", "ok"] and len(launched) == 2
    stamped = read_report(out / "baseline_b2.json")
    assert stamped.fingerprint and stamped.environment.hostname
    # the same study again: resumed, nothing measured, nothing changed
    before = _bytes(out)
    again = study.run_study(path, out, progress=False, aggregate=False).results
    assert [r.status for r in again] == ["skipped", "skipped"] and len(launched) == 2
    assert "same fingerprint" in again[0].message
    assert _bytes(out) == before

    # a report measured elsewhere under the same name is measured again, and kept aside
    other = stamped.model_copy(deep=True)
    other.environment.hostname = "another-machine"
    write_report(other, out / "baseline_b2.json")
    third = study.run_study(path, out, progress=False, aggregate=False).results
    assert [r.status for r in third] == ["ok", "skipped"] and len(launched) == 3
    assert "another-machine" in third[0].message
    assert read_report(out / "baseline_b2.json").environment.hostname != "another-machine"
    kept = list((out / "superseded").rglob("baseline_b2.json"))
    assert len(kept) == 1 and read_report(kept[0]).environment.hostname == "another-machine"


def test_changed_matrix_is_measured_again_not_relabelled(tiny_data_dir, tmp_path, monkeypatch):
    """Issue 15: same run names, another model width: the old reports are not relabelled."""
    _kernel_in_process(monkeypatch)
    out = tmp_path / "study"
    study.run_study(_matrix(tmp_path, tiny_data_dir, TWO), out, progress=False, aggregate=False)
    old_width = read_report(out / "baseline_b2.json").config["model"]["heptv2"]["width"]
    wider = _matrix(
        tmp_path,
        tiny_data_dir,
        runs=[{**ONE[0], "overrides": ["model.heptv2.width=48"]}],
        name="wider.yaml",
    )
    results = study.run_study(wider, out, progress=False, aggregate=False).results
    assert [r.status for r in results] == ["ok"]
    assert "measured with another" in results[0].message and "configuration" in results[0].message
    for name in ("baseline_b2",):
        assert read_report(out / f"{name}.json").config["model"]["heptv2"]["width"] == 48
        (aside,) = (out / "superseded").rglob(f"{name}.json")
        assert read_report(aside).config["model"]["heptv2"]["width"] == old_width
    # a run the new matrix does not have leaves the study folder (kept aside)
    assert not (out / "checkpointed_b2.json").exists()
    assert not (out / "notebooks" / "checkpointed_b2.ipynb").exists()
    assert len(list((out / "superseded").rglob("checkpointed_b2.*"))) == 2
    assert (out / "matrix.yaml").read_text() == wider.read_text()
    assert list((out / "superseded").rglob("matrix.yaml")), "the old matrix copy is kept"


def test_force_keeps_the_old_results(tiny_data_dir, tmp_path, monkeypatch):
    _kernel_in_process(monkeypatch)
    path, out = _matrix(tmp_path, tiny_data_dir), tmp_path / "study"
    study.run_study(path, out, progress=False, aggregate=False)
    old = _bytes(out)
    forced = study.run_study(path, out, force=True, progress=False, aggregate=False).results
    assert [r.status for r in forced] == ["ok"]
    (stamp,) = (out / "superseded").iterdir()
    for name in ("baseline_b2.json", "notebooks/baseline_b2.ipynb"):
        assert (stamp / name).read_bytes() == old[name]  # moved aside, byte for byte
        assert (out / name).exists()
    assert not (out / ".pending").exists()


def test_input_error_stops_before_anything_runs(tiny_data_dir, tmp_path, monkeypatch, capsys):
    """Issue 15: --force with a mistyped --data-dir deleted the good reports and exited 0."""
    from heptstudy.cli import main

    launched = _kernel_in_process(monkeypatch)
    path, out = _matrix(tmp_path, tiny_data_dir), tmp_path / "study"
    study.run_study(path, out, progress=False, aggregate=False)
    before = _bytes(out)
    code = main(
        ["study", "run", "--matrix", str(path), "--out", str(out), "--force", "--no-progress"]
        + ["--data-dir", str(tmp_path / "tfsd"), "--no-aggregate"]
    )
    err = capsys.readouterr().err
    assert code != 0 and len(launched) == 1
    assert "cannot be measured, so nothing was measured or changed" in err
    assert "baseline_b2:" in err and "tfsd" in err and "does not exist" in err
    assert _bytes(out) == before


def _dying_kernel(monkeypatch, errors: dict[str, BaseException]):
    """Kernels that fail with ``errors[run name]`` before the notebook writes its report."""
    launched = []

    def kernel(input_path, output_path, parameters, **_):
        name = Path(parameters["output"]).stem
        launched.append(name)
        raise errors[name]

    monkeypatch.setattr(papermill, "execute_notebook", kernel)
    return launched


def test_failed_runs_leave_reports_that_say_why_and_the_study_goes_on(
    tiny_data_dir, tmp_path, monkeypatch
):
    """A dead kernel and an out-of-memory cell are results: each run gets a report saying so,
    the next run is still measured, and the study ends with what failed."""
    oom = PapermillExecutionError(
        4,
        1,
        "run_bench(...)",
        "OutOfMemoryError",
        "CUDA out of memory. Tried to allocate 2 GiB",
        [],
    )
    launched = _dying_kernel(
        monkeypatch, {"baseline_b2": DeadKernelError("Kernel died"), "checkpointed_b2": oom}
    )
    path, out = _matrix(tmp_path, tiny_data_dir, TWO), tmp_path / "study"
    results = study.run_study(path, out, progress=False, aggregate=False).results
    assert launched == ["baseline_b2", "checkpointed_b2"]
    assert [r.status for r in results] == ["error", "oom"]
    dead = read_report(out / "baseline_b2.json")
    assert dead.status == "error" and "kernel died" in dead.error and dead.data.synthetic
    assert dead.batch_size == 2 and dead.checkpointing.plan == "off"
    assert any("did not write a report" in n for n in dead.notes)
    killed = read_report(out / "checkpointed_b2.json")
    assert killed.status == "oom" and killed.oom.batch_size == 2
    assert killed.checkpointing.plan == "full" and "CUDA out of memory" in killed.oom.message
    assert not (out / ".pending").exists()


def test_an_error_report_does_not_block_the_retry(tiny_data_dir, tmp_path, monkeypatch, capsys):
    from heptstudy.cli import main

    path, out = _matrix(tmp_path, tiny_data_dir), tmp_path / "study"
    _dying_kernel(monkeypatch, {"baseline_b2": RuntimeError("kernel trouble")})
    code = main(
        ["study", "run", "--matrix", str(path), "--out", str(out), "--no-progress"]
        + ["--no-aggregate"]
    )
    assert code == 1 and "1 run(s) failed: baseline_b2" in capsys.readouterr().out
    assert read_report(out / "baseline_b2.json").status == "error"
    _kernel_in_process(monkeypatch)
    retry = study.run_study(path, out, progress=False, aggregate=False).results
    assert [r.status for r in retry] == ["ok"]
    assert "error: measuring again" in retry[0].message
    assert len(list((out / "superseded").rglob("*.json"))) == 1  # the error report, kept


def test_a_default_allocator_run_starts_its_kernel_without_allocator_settings(
    tiny_data_dir, tmp_path, monkeypatch
):
    """``allocator: default``: the kernel starts without the allocator variables this process
    has; other runs' kernels inherit them (their measurement applies the platform's)."""
    seen = {}

    def kernel(input_path, output_path, parameters, **_):
        seen[Path(parameters["output"]).parent.name] = os.environ.get("MALLOC_TOP_PAD_")

    monkeypatch.setattr(papermill, "execute_notebook", kernel)
    monkeypatch.setenv("MALLOC_TOP_PAD_", "1")
    runs = [ONE[0], {**ONE[0], "allocator": "default"}]
    study.run_study(
        _matrix(tmp_path, tiny_data_dir, runs), tmp_path / "s", progress=False, aggregate=False
    )
    assert seen == {".pending": "1", "default_allocator": None}
    assert os.environ["MALLOC_TOP_PAD_"] == "1"  # this process's environment is back


def test_where_a_study_writes(tmp_path, monkeypatch):
    from heptstudy.committed import CommittedFolder
    from heptstudy.study.outputs import default_study_dir, study_folders

    mine = study_folders(None, None, None)
    assert mine.out == default_study_dir() and mine.out.parent == ROOT / "experiments" / "local"
    assert mine.figures == mine.out / "figures"
    with pytest.raises(CommittedFolder, match="committed reference folder.*--reference cpu_refer"):
        study_folders(ROOT / "experiments" / "cpu_reference", None, None)
    with pytest.raises(CommittedFolder, match="--figures figures/cpu_reference is a committed"):
        study_folders(tmp_path, ROOT / "figures" / "cpu_reference", None)
    ref = study_folders(None, None, "cpu_reference")
    assert (ref.out, ref.figures) == (
        ROOT / "experiments" / "cpu_reference",
        ROOT / "figures" / "cpu_reference",
    )
    with pytest.raises(StudyError, match="not a reference study name"):
        study_folders(None, None, "../x")


def test_a_committed_study_is_aggregated_again_only_by_name(capsys):
    """`study aggregate --reference NAME` redraws a committed study from its committed reports
    (after a change to the aggregate), its figures where they are committed, its report titled
    by the matrix it was measured with; `--out` on it is still refused."""
    from heptstudy.cli.study import _matrix_of
    from heptstudy.committed import CommittedFolder
    from heptstudy.study.outputs import aggregate_folders

    experiments = ROOT / "experiments"
    assert aggregate_folders(None, None, "cpu_reference") == (
        experiments / "cpu_reference",
        ROOT / "figures" / "cpu_reference",
    )
    # a committed study whose figures are in its own folder
    assert aggregate_folders(None, None, "study_paired_epyc") == (
        experiments / "study_paired_epyc",
        experiments / "study_paired_epyc" / "figures",
    )
    with pytest.raises(CommittedFolder, match="committed reference folder"):
        aggregate_folders(experiments / "cpu_reference", None)
    with pytest.raises(StudyError, match="experiments/nope is no committed study"):
        aggregate_folders(None, None, "nope")
    with pytest.raises(StudyError, match="holds no study"):  # committed, but no study's reports
        aggregate_folders(None, None, "recompute_floor")
    with pytest.raises(StudyError, match="leave out --out and --figures"):
        aggregate_folders(None, ROOT / "figures" / "cpu_reference", "cpu_reference")
    matrix = _matrix_of(experiments / "cpu_reference")
    assert matrix is not None and matrix.name == "cpu_default" and matrix.notes


def test_a_study_folder_s_unreadable_matrix_is_said_not_fatal(tmp_path, capsys):
    from heptstudy.cli.study import _matrix_of

    assert _matrix_of(tmp_path) is None  # none: the folder's name titles the report
    (tmp_path / "matrix.yaml").write_text("runs: [\n")
    assert _matrix_of(tmp_path) is None
    said = capsys.readouterr().out
    assert "matrix.yaml does not read" in said and "titled by the folder's name" in said


def test_unwritable_out_refused_before_measuring(tiny_data_dir, tmp_path, monkeypatch):
    launched = _kernel_in_process(monkeypatch)
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.raises(StudyError, match="cannot write to .*nothing was measured"):
        study.run_study(
            _matrix(tmp_path, tiny_data_dir), blocked / "study", progress=False, aggregate=False
        )
    assert launched == []


def test_rounds_alternate_and_repeat_timing_only(tiny_data_dir, tmp_path):
    path = _matrix(
        tmp_path,
        tiny_data_dir,
        runs=[
            {"batch_size": 1, "checkpointing": False},
            {"batch_size": 1, "checkpointing": True},
            {"batch_size": 2, "checkpointing": True, "repeats": 1, "passes": "memory"},
            {"notebook": "parity", "batch_size": 1},
            {"batch_size": 1, "allocator": "default", "repeats": 1, "passes": "timing"},
        ],
        repeats=3,
    )
    order = [(e.label, e.parameters.get("passes")) for e in schedule(study.load_matrix(path).runs)]
    assert order == [
        ("baseline_b1", None),
        ("checkpointed_b1", None),
        ("checkpointed_b2", "memory"),
        ("parity_b1", None),
        ("baseline_b1 (default allocator)", "timing"),
        ("baseline_b1 (round 2)", "timing"),
        ("checkpointed_b1 (round 2)", "timing"),
        ("baseline_b1 (round 3)", "timing"),
        ("checkpointed_b1 (round 3)", "timing"),
    ]
    ex = Execution(study.load_matrix(path).runs[0], 3)
    assert ex.report == Path("repeats/baseline_b1.r3.json")
    assert ex.notebook == Path("notebooks/repeats/baseline_b1.r3.ipynb")
    assert locate(ex.report) == ("platform", "baseline_b1", 3)
    assert locate(Path("default_allocator/baseline_b4.json")) == ("default", "baseline_b4", 1)
    bad = _matrix(tmp_path, tiny_data_dir, runs=[{"batch_size": 1, "repeats": 0}], name="b.yaml")
    with pytest.raises(StudyError, match="repeats=0 is not allowed"):
        study.load_matrix(bad)
    bad = _matrix(tmp_path, tiny_data_dir, runs=[{"batch_size": 1, "allocator": "je"}], name="c")
    with pytest.raises(StudyError, match="allocator='je' is not allowed"):
        study.load_matrix(bad)


def _profile(name):
    from heptstudy.config import load_platform
    from heptstudy.paths import PLATFORM_DIR

    return load_platform(PLATFORM_DIR / f"{name}.yaml")


def test_allocator_settings_and_the_environment_a_process_starts_with(monkeypatch):
    settings = alloc.measurement_allocator(_profile("local_cpu"), "cpu")
    assert settings == {
        "MALLOC_MMAP_THRESHOLD_": str(16 * 2**30),
        "MALLOC_TOP_PAD_": str(2**30),
        "MALLOC_TRIM_THRESHOLD_": str(16 * 2**30),
    }
    # a CPU bench without --platform runs with local_cpu's settings; a GPU one keeps its own
    assert alloc.measurement_allocator(None, "cpu") == settings
    assert alloc.measurement_allocator(None, "cuda") is None
    assert alloc.measurement_allocator(_profile("h100"), "cuda") is None
    env = SimpleNamespace(allocator="glibc 2.36", allocator_settings=settings)
    label = alloc.allocator_label(SimpleNamespace(environment=env))
    assert label.startswith("glibc 2.36 (MALLOC_MMAP_THRESHOLD_=16 GiB")
    base = {"PATH": "/bin", "MALLOC_ARENA_MAX": "2", "LD_PRELOAD": "/x/libjemalloc.so"}
    assert alloc.environment_with({}, base) == {"PATH": "/bin"}
    assert alloc.environment_with(settings, base) == {"PATH": "/bin", **settings}
    assert alloc.allocator_name({"LD_PRELOAD": "/x/libtcmalloc.so.4"}) == "tcmalloc"
    assert alloc.start_environment().get("PATH")  # read from /proc/self/environ
    with pytest.raises(HeptstudyError, match=r"\['LD_PRELOAD'\] cannot be set with mallopt"):
        alloc.apply_allocator({"LD_PRELOAD": "/x/libjemalloc.so"})
    with pytest.raises(HeptstudyError, match="is not a byte count"):
        alloc.apply_allocator({"MALLOC_TOP_PAD_": "1G"})


@pytest.mark.parametrize("line", ["platform", "default"])
def test_bench_command_applies_its_allocator_itself(line, tiny_data_dir, tmp_path):
    """`heptstudy bench` on a CPU, no --platform, started with a stray glibc variable: the
    measurement applies local_cpu's settings with mallopt (the stray one overridden), or, for
    --allocator default, nothing (the report records the variable the process started with)."""
    import subprocess
    import sys

    out = tmp_path / "b1.json"
    overrides = [a for o in TINY_MODEL for a in ("--set", o)]
    argv = ["bench", "--batch-size", "1", "--passes", "timing", "--steps", "1", "--warmup", "0"]
    argv += ["--data-dir", str(tiny_data_dir), "--output", str(out), "--no-progress"]
    stray = {"MALLOC_TOP_PAD_": "4096"} if line == "platform" else {}
    env = alloc.environment_with(stray)
    done = subprocess.run(
        [sys.executable, "-m", "heptstudy", *argv, *overrides, "--allocator", line],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    settings = alloc.measurement_allocator(None, "cpu")
    report = read_report(out)
    if line == "platform":
        assert report.environment.allocator_settings == settings
        assert report.environment.allocator_applied == {
            "MALLOC_MMAP_THRESHOLD_": 2**31 - 1,  # mallopt's largest: it takes a C int
            "MALLOC_TOP_PAD_": 2**30,
            "MALLOC_TRIM_THRESHOLD_": 2**31 - 1,
        }
    else:
        assert report.environment.allocator_settings == {}
        assert report.environment.allocator_applied is None
    mapped = [n for n in report.notes if n.startswith("the heap's") and "mapped after" in n]
    assert len(mapped) == (line == "platform")
    # its summary says which allocator, and what glibc's defaults do to the times
    from heptstudy.measure.summary import describe

    said = describe(report)
    assert f"allocator: {report.environment.allocator}" in said
    assert ("include its page faults" in said) == (line == "default")


_FIRST_TOUCHES = """
import ctypes, resource, sys
from heptstudy.meters import allocator as alloc
alloc.apply_allocator(alloc.measurement_allocator(None, "cpu"))
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
mapped = alloc.populate_heap() if sys.argv[1] == "populate" else 0
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
ctypes.memset(libc.malloc(256 * 2**20), 1, 256 * 2**20)
print(mapped, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.parametrize("populate", [True, False])
def test_populating_the_heap_spares_a_later_block_its_first_touches(populate):
    """local_cpu's settings keep a padded heap, yet a block above the process's high-water mark
    faults in every page on first use (65,536 for 256 MiB) unless the heap was populated, which
    grows its free top to the pad (1 GiB) and maps it."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _FIRST_TOUCHES, "populate" if populate else "no"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    mapped, faults = map(int, done.stdout.split())
    if populate:
        assert mapped >= 256 * 2**20 and faults < 1_000
    else:
        assert mapped == 0 and faults > 60_000


def test_host_usage_counts_page_faults():
    import mmap

    # a fresh anonymous mapping (not the heap, which an earlier in-process measurement may
    # have touched already): the kernel maps and zeroes each page on its first touch
    block = mmap.mmap(-1, 64 * 2**20)
    with HostUsage() as usage:
        for offset in range(0, len(block), mmap.PAGESIZE):
            block[offset] = 1
    assert usage.minor_page_faults > 1000
    assert set(asdict(usage)) == {
        "minor_page_faults",
        "major_page_faults",
        "system_time_s",
        "user_time_s",
    }


def test_host_usage_times_the_block_not_the_process():
    import time

    # a sleeping block uses next to no CPU time, although the process has used seconds by now
    with HostUsage() as idle:
        time.sleep(0.1)
    assert idle.user_time_s + idle.system_time_s < 0.05 < time.process_time()
    before = time.process_time()
    with HostUsage() as busy:
        while time.process_time() - before < 0.2:
            pass
    spent = time.process_time() - before
    assert spent - 0.02 <= busy.user_time_s + busy.system_time_s <= spent + 0.02


def _timed(name, b, enabled, policy, t, round_=1, line="platform", sys_frac=0.05, faults=1e4):
    return {
        "file": f"{name}.json",
        "name": name,
        "kind": "memory",
        "status": "ok",
        "batch_size": b,
        "checkpointing": enabled,
        "policy": policy if enabled else "none",
        "checkpoint_every": 1,
        "policy_label": "off" if not enabled else policy,
        "round": round_,
        "allocator_line": line,
        "peak_allocated_mib": 100.0 if not enabled else 40.0,
        "peak_reserved_mib": 200.0,
        "mean_step_s": t,
        "counted_steps": 2,
        "warmup_steps": 1,
        "sys_fraction": sys_frac,
        "minor_faults_per_step": faults,
        "system_s_per_step": sys_frac * t,
        "allocator": "glibc 2.36 (defaults)" if line == "default" else "glibc 2.36 (tuned)",
        "host": "h",
    }


def test_off_rounds_apart_by_more_than_half_are_flagged():
    """In fresh processes the machine's speed can move by more than a plan's overhead (the
    reference's padded off at batch 4: 22.3, 11.7 and 13.1 s); the overhead says so."""
    rows = []
    for k, (off, on) in enumerate([(20.0, 13.0), (10.0, 12.0), (11.0, 12.0)], start=1):
        rows.append(_timed("baseline_b4", 4, False, "off", off, k))
        rows.append(_timed("auto_b4", 4, True, "auto", on, k))
    over = study.overhead_frame(pd.DataFrame(rows)).iloc[0]
    assert over["overhead_median_pct"] == pytest.approx(100 * (12.0 / 11.0 - 1))
    assert "off's rounds took 10.00 to 20.00 s" in over["flag"]


def test_overhead_is_the_median_and_range_over_rounds_and_flags_system_time():
    rows = []
    for k, (off, on) in enumerate([(10.0, 13.0), (12.0, 15.0), (10.0, 14.0)], start=1):
        rows.append(_timed("baseline_b4", 4, False, "off", off, k))
        rows.append(_timed("checkpointed_b4", 4, True, "full", on, k))
    # the allocator as it comes: system time dominates the baseline
    rows.append(_timed("baseline_b4", 4, False, "off", 20.0, line="default", sys_frac=0.45))
    rows.append(_timed("checkpointed_b4", 4, True, "full", 19.0, line="default", sys_frac=0.25))
    df = pd.DataFrame(rows)
    over = study.overhead_frame(df).set_index("allocator_line")
    tuned = over.loc["platform"]
    assert tuned["rounds"] == 3
    assert tuned["overhead_median_pct"] == pytest.approx(30.0)
    assert (tuned["overhead_min_pct"], tuned["overhead_max_pct"]) == pytest.approx((25.0, 40.0))
    assert tuned["off_step_s"] == 10.0 and tuned["on_step_s"] == 14.0 and tuned["flag"] == ""
    default = over.loc["default"]
    assert default["rounds"] == 1 and default["overhead_median_pct"] == pytest.approx(-5.0)
    assert "system time dominates (off 45% of the step)" in default["flag"]
    comp = study.comparison_frame(df).iloc[0]
    assert comp["step_time_overhead_pct"] == pytest.approx(30.0) and comp["rounds"] == 3
    assert comp["allocated_reduction_pct"] == pytest.approx(60.0)
    table = study.overhead_table(study.overhead_frame(df))
    assert "flag" in table.columns and str(table["rounds"].dtype) == "Int64"
    text = study.study_statement(
        df.assign(
            device="cpu",
            device_kind="cpu",
            dtype="f",
            threads=2,
            torch="2",
            dataset="d",
            data_dir="data/x",
            synthetic=True,
        )
    )
    assert "**System time dominates:** baseline_b4 (default allocator): 45% of the step" in text
    assert "median and range" in text and "Allocator (default line)" in text


def test_report_tables_read_well(tmp_path):
    rows = [
        {
            **_timed("baseline_b1", 1, False, "off", 3.0),
            "counted_steps": 2.0,
            "max_padded_hits": 10624.0,
            "error": None,
        },
        {
            **_timed("baseline_b1", 1, False, "off", 3.4, round_=2),
            "counted_steps": 2.0,
            "max_padded_hits": 10624.0,
            "error": None,
        },
    ]
    table = study.runs_table(pd.DataFrame(rows))
    assert len(table) == 1 and table["step [s]"].iloc[0] == pytest.approx(3.2)  # median
    assert table["rounds"].iloc[0] == 2 and table["measured on"].iloc[0] == "h"
    html = study.show(table).to_html()
    assert ">2<" in html and ">10,624<" in html and ">2.0<" not in html
    assert "row_heading" not in html, "no pandas index column"
    from heptstudy.study.outputs import shown

    assert shown(ROOT / "data" / "tfds") == "data/tfds" and shown("data/tfds") == "data/tfds"


def test_report_records_allocator_and_page_faults_of_each_step(tiny_data_dir, tmp_path):
    """Issue 18: allocator, its settings, page faults and system time per counted step."""
    from heptstudy.measure.bench import run_bench

    request = tiny_request(tiny_data_dir, tmp_path / "r.json", batch_size=2, steps=1, warmup=1)
    report = run_bench(request.resolve())
    env = report.environment  # applied in this process: a CPU without a platform is local_cpu
    assert env.allocator.startswith("glibc")
    assert env.allocator_settings == alloc.measurement_allocator(None, "cpu")
    assert env.allocator_applied["MALLOC_TOP_PAD_"] == 2**30
    counted = [s for s in report.steps if s.counted]
    assert all(s.minor_page_faults is not None and s.minor_page_faults >= 0 for s in counted)
    assert all(s.system_time_s is not None and s.user_time_s > 0 for s in counted)
    usage = study.host_usage_of(report)
    assert usage["minor_faults_per_step"] == sum(s.minor_page_faults for s in counted)
    data = json.loads((tmp_path / "r.json").read_text())
    assert "allocator_settings" in data["environment"] and "minor_page_faults" in data["steps"][0]
    timing = run_bench(request.model_copy(update={"passes": "timing"}).resolve())
    assert timing.summary.mean_step_time_s > 0 and timing.summary.max_peak_allocated_mib is None
    assert timing.validation is None and "timing only" in timing.summary.tracked_memory_note
