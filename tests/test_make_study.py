"""`make study` on a fresh copy of the repository: its own file, so that the test runner can run
it beside the other notebook tests (it is the longest single test)."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import yaml

from heptstudy.measure.report import read_report

ROOT = Path(__file__).resolve().parent.parent


def _fresh_copy(tmp_path) -> Path:
    """The repository as a new user gets it: the working tree's tracked and new (not ignored)
    files, committed in a repository of their own."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    copy = tmp_path / "checkout"
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file() and not name.startswith(("experiments/h200", "data/")):
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=copy, check=True)
    subprocess.run(["git", "add", "-A"], cwd=copy, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "copy"], cwd=copy, check=True)
    return copy


def test_make_study_on_a_fresh_copy(tiny_data_dir, tmp_path):
    """Issue 15: `make study`'s own study command on a fresh copy of the repository with the tiny
    matrix measures every run (none skipped), writes the user's own folder, changes no committed
    file, and the report reads well; every report carries its fingerprint (the runner checked that
    the kernel measured what the run asked: the study resumes it; tests/test_study_runner.py).
    Issue 18: every report records its allocator and page faults; the default-allocator run is its
    own line."""
    copy = _fresh_copy(tmp_path)
    matrix = yaml.safe_load((copy / "configs" / "study" / "tiny.yaml").read_text())
    matrix["defaults"].update(steps=1, warmup=1)
    matrix["runs"] = [
        {"batch_size": 2, "checkpointing": False},
        {"batch_size": 2, "checkpointing": "true"},
        # memory only: its step time is the paired run's
        {"batch_size": 2, "checkpointing": "selective", "passes": "memory"},
        {"batch_size": 2, "checkpointing": False, "allocator": "default", "passes": "timing"},
        {"notebook": "paired", "batch_size": 2, "plans": ["full", "selective"], "rounds": 1},
    ]
    path = tmp_path / "matrix.yaml"  # outside the checkout: nothing added to it
    path.write_text(yaml.safe_dump(matrix))
    stamp = ROOT / ".venv" / ".heptstudy-installed"  # installed already: make must not reinstall
    make = ["make", "-o", str(stamp), "study", f"VENV={ROOT / '.venv'}", f"STUDY_MATRIX={path}"]
    make += [f"DATA_DIR={tiny_data_dir}", "STUDY_FLAGS=--no-progress"]
    res = subprocess.run(make, cwd=copy, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out_line = next(line for line in res.stdout.splitlines() if line.startswith("reports: "))
    out = copy / out_line.removeprefix("reports: ").rstrip("/")
    assert out.parent == copy / "experiments" / "local", "a user's study goes to its own folder"
    table = res.stdout[res.stdout.index("\nrun ") :]
    assert table.count(" measured ") == 5 and "resumed" not in table and "skipped" not in table
    assert re.search(r"paired_b2 +ok +measured .*2 plans paired with it over 1 rounds", table)
    assert "report: experiments/local/" in res.stdout
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=copy, capture_output=True, text=True, check=True
    )
    assert status.stdout == "", f"committed files changed or outputs not ignored: {status.stdout}"

    settings = yaml.safe_load((copy / "configs/training/platforms/local_cpu.yaml").read_text())
    for name in ("baseline_b2", "checkpointed_b2", "checkpointed_selective_b2"):
        report = read_report(out / f"{name}.json")
        assert report.status == "ok" and report.fingerprint
        assert report.environment.allocator_settings == settings["env"]
        assert report.environment.allocator_applied["MALLOC_TOP_PAD_"] == 2**30  # in the kernel
        counted = [s for s in report.steps if s.counted and s.time_s is not None]
        if name != "checkpointed_selective_b2":  # memory only: no timed steps
            assert counted and all(s.minor_page_faults is not None for s in counted)
            assert all(s.system_time_s is not None for s in counted)
        assert (out / "notebooks" / f"{name}.ipynb").exists()
    selective = read_report(out / "checkpointed_selective_b2.json")
    assert selective.checkpointing.plan == selective.plan.name == "selective"
    assert selective.summary.max_peak_allocated_mib and selective.summary.mean_step_time_s is None
    default = read_report(out / "default_allocator" / "baseline_b2.json")
    assert default.environment.allocator_settings == {} and default.summary.mean_step_time_s
    assert default.environment.allocator_applied is None
    assert default.summary.max_peak_allocated_mib is None  # timing only

    # the paired run: its own report kind, stamped, and the front's times are its rounds
    paired = json.loads((out / "paired" / "paired_b2.json").read_text())
    assert paired["kind"] == "paired_timing" and paired["fingerprint"]
    assert set(paired["overhead"]) == {"full", "selective"} and paired["rounds"] == 1
    assert (out / "notebooks" / "paired" / "paired_b2.ipynb").exists()
    front = pd.read_csv(out / "front.csv").set_index("policy")
    assert front.loc["off", "timing"] == "fresh processes"
    for plan in ("full", "selective"):  # memory from its memory run, time from the paired rounds
        assert front.loc[plan, "timing"] == "paired, one process"
        assert front.loc[plan, "peak_allocated_mib"] > 0
        overhead = front.loc[plan, "step_time_overhead_pct"]
        assert overhead == pytest.approx(100 * paired["overhead"][plan]["median"], abs=1e-6)

    html = (out / "report.html").read_text()
    assert "data:image/png;base64" in html, "figures are embedded in the report"
    assert "smoke measurements" in html and "synthetic" in html
    assert "study.reports_frame" not in html, "the report hides the code"
    assert str(copy) not in html, "no absolute path of the producing machine"
    assert "measured on" in html and report.environment.hostname in html
    assert "Allocator (default line)" in html and "Allocator (platform setting)" in html
    assert "which count as temporaries" in html  # what the categories mean
    figures = out / "figures"
    for fig in (
        "peak_allocated_vs_batch",
        "memory_reduction_vs_batch",
        "step_time_overhead_vs_batch",
        "hits_per_event",
        "policy_front",
        "memory_categories",
    ):
        assert (figures / f"{fig}.png").exists() and (figures / f"{fig}.pdf").exists()
    executed = nbformat.read(out / "aggregate.ipynb", as_version=4)
    runs_cell = next(c for c in executed.cells if c.source.startswith("study.show(study.runs"))
    runs_html = runs_cell.outputs[0]["data"]["text/html"]
    assert "row_heading" not in runs_html, "no pandas index column"
    assert "counted steps" in runs_html and not re.search(r">\d+\.0<", runs_html)
    text = "\n".join(c.source for c in executed.cells) + json.dumps(
        [o for c in executed.cells for o in c.get("outputs", [])]
    )
    assert "skipped: no parity reports" in text
    assert "validation skipped" in text  # one batch size: nothing to leave out
